"""What the cache-aware router reads of the simulated replicas' caches: a
:class:`LiveIndex` fed by each replica's KV-cache events as its steps publish them.

It answers the two questions :class:`~pagedkv.cluster.router.Router` asks a
:class:`~pagedkv.cluster.index.ClusterIndex` — :meth:`LiveIndex.longest_prefix` and
:meth:`LiveIndex.held_positions` — exactly as a
:class:`~pagedkv.cluster.index.MemoryIndex` fed by an
:class:`~pagedkv.cluster.ingest.IndexIngest` with no delay answers them (a test replays
both and compares): a block is held while its stored copies outnumber its removals, per
KV-cache group and tier (the event's medium). What it leaves out is what a simulation on
one clock never needs: writer leases, replica states, digests and the reverse table, so a
block costs two dictionary updates instead of the production path's bookkeeping (the
cache-aware replay of the bundled default took about four times least-loaded's with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.cluster.index import Replica
from pagedkv.core.records import AllBlocksCleared, BlockRemoved, BlockStored
from pagedkv.events.wire import wire_hash

__all__ = ["NO_TIER", "LiveIndex"]

#: The tier of an event without a medium (as the production ingest names it).
NO_TIER = "-"


class LiveIndex:
    """Per (group, wire hash): the replicas holding it, with their copies per tier."""

    def __init__(self) -> None:
        # replicas by key (strings hash once; a Replica hashes its fields every time)
        self._holders: dict[tuple[int, int], dict[str, dict[str, int]]] = {}
        self._replicas: dict[str, Replica] = {}

    def apply(self, replica: Replica, events: Sequence[Any]) -> None:
        """One step's events of ``replica``. O(block hashes in them)."""
        holders = self._holders
        rkey = self._replicas.setdefault(replica.key, replica).key
        for event in events:
            kind = type(event)
            if kind is AllBlocksCleared:
                self._clear(rkey)
                continue
            if kind is not BlockStored and kind is not BlockRemoved:
                continue
            tier = event.medium or NO_TIER
            group = event.group_idx
            for h in event.block_hashes:
                key = (group, wire_hash(h))
                reps = holders.get(key)
                if kind is BlockStored:
                    if reps is None:
                        reps = holders[key] = {}
                    tiers = reps.setdefault(rkey, {})
                    tiers[tier] = tiers.get(tier, 0) + 1
                    continue
                held = reps.get(rkey) if reps is not None else None
                if reps is None or not held or tier not in held:
                    continue  # removal of a copy this index never saw stored
                if held[tier] > 1:
                    held[tier] -= 1
                    continue
                del held[tier]
                if not held:
                    del reps[rkey]
                    if not reps:
                        del holders[key]

    def _clear(self, rkey: str) -> None:
        for key in list(self._holders):
            reps = self._holders[key]
            if reps.pop(rkey, None) is not None and not reps:
                del self._holders[key]

    def longest_prefix(self, group_idx: int, block_hashes: Sequence[int], *,
                       tier: str | None = None) -> dict[Replica, int]:
        """Per replica holding at least the first block, how many leading
        ``block_hashes`` of group ``group_idx`` it holds (on ``tier``; None: any)."""
        counts: dict[str, int] = {}
        alive: Any = None
        holders = self._holders
        for position, h in enumerate(block_hashes, start=1):
            reps = holders.get((group_idx, h))
            if not reps:
                break
            matching = [r for r in (reps if alive is None else alive)
                        if (t := reps.get(r)) and (tier is None or tier in t)]
            if not matching:
                break
            for r in matching:
                counts[r] = position
            alive = matching
        return {self._replicas[k]: n for k, n in counts.items()}

    def held_positions(self, group_idx: int, block_hashes: Sequence[int], *,
                       tier: str | None = None) -> dict[Replica, set[int]]:
        """Per replica, the positions ``i`` whose ``block_hashes[i]`` it holds."""
        out: dict[str, set[int]] = {}
        for position, h in enumerate(block_hashes):
            for r, t in self._holders.get((group_idx, h), {}).items():
                if tier is None or tier in t:
                    out.setdefault(r, set()).add(position)
        return {self._replicas[k]: p for k, p in out.items()}
