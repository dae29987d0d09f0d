"""The cluster prefix index: which replicas hold which blocks, for one model.

A *replica* is one engine's KV cache: a pod and (under data parallelism) a DP rank. A
*block reference* is ``(group_idx, wire hash, tier)``: a block of one KV-cache group,
named by the unsigned 64-bit hash it has on the event wire, on one tier (the event's
``medium``: ``"GPU"``, ``"CPU"``; ``"-"`` when the publisher sends none).

The index only records *presence*: the ingest (:mod:`pagedkv.cluster.ingest`) counts
copies per replica and tells the index when a block appears on or disappears from a
replica. Two backends implement :class:`ClusterIndex`: :class:`MemoryIndex` (in process,
used by the simulator and by a router that ingests itself) and
:class:`pagedkv.cluster.redis_index.RedisIndex` (shared by many router processes).

Example::

    >>> index = MemoryIndex(model="m")
    >>> a, b = Replica(pod="a"), Replica(pod="b", dp_rank=1)
    >>> index.update(a, added=[(0, 11, "GPU"), (0, 12, "GPU")], removed=[])
    >>> index.update(b, added=[(0, 11, "CPU")], removed=[])
    >>> sorted(index.longest_prefix(0, [11, 12, 13]).items())
    [(Replica(pod='a', dp_rank=None), 2), (Replica(pod='b', dp_rank=1), 1)]
    >>> index.clear_replica(a)
    >>> index.longest_prefix(0, [11, 12, 13])
    {Replica(pod='b', dp_rank=1): 1}
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pagedkv.errors import InvalidArgumentError, PagedKVError

__all__ = [
    "ANY_TIER",
    "BlockRef",
    "ClusterIndex",
    "IndexUnavailableError",
    "MemoryIndex",
    "Replica",
    "ReplicaState",
]

BlockRef = tuple[int, int, str]
"""``(group_idx, wire hash as u64, tier)`` of one block on one replica."""

ANY_TIER = None
"""``tier`` argument of lookups that accept a block on any tier."""

_SEP = "|"


class IndexUnavailableError(PagedKVError):
    """The index backend cannot be reached (e.g. Redis is down). Callers degrade: the
    router routes by load alone, the ingest keeps counting and rewrites the index when
    the backend is back."""


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Replica:
    """One engine's KV cache: ``pod`` (no ``|`` in it) and its DP rank (None: no DP)."""

    pod: str
    dp_rank: int | None = None

    def __post_init__(self) -> None:
        if not self.pod or _SEP in self.pod:
            raise InvalidArgumentError(
                f"a pod name must be non-empty and without '|', got {self.pod!r}"
            )
        if self.dp_rank is not None and (type(self.dp_rank) is not int or self.dp_rank < 0):
            raise InvalidArgumentError(f"dp_rank must be None or an int >= 0: {self.dp_rank!r}")

    @property
    def key(self) -> str:
        """``"pod|rank"`` (``"pod|-"`` without a rank): its name inside the index.

        >>> Replica(pod="vllm-0", dp_rank=3).key
        'vllm-0|3'
        """
        return f"{self.pod}{_SEP}{'-' if self.dp_rank is None else self.dp_rank}"

    @classmethod
    def from_key(cls, key: str) -> Replica:
        """Inverse of :attr:`key`; raises InvalidArgumentError for a malformed key."""
        pod, sep, rank = key.rpartition(_SEP)
        if not sep or not (rank == "-" or rank.isdigit()):
            raise InvalidArgumentError(f"not a replica key (pod|rank): {key!r}")
        return cls(pod=pod, dp_rank=None if rank == "-" else int(rank))


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaState:
    """What the index says about one replica: ``state`` is ``"synced"`` (the entries
    mirror every event) or ``"rebuilding"`` (a gap nobody could repair: the replica's
    entries were cleared and are rebuilt from the events that followed), ``num_blocks``
    the block references it holds."""

    state: str
    num_blocks: int


class ClusterIndex(ABC):
    """Presence of blocks on replicas, for one model (``model`` namespaces the data).

    Writers: one ingest per replica. Readers: any number of routers. Every method may
    raise :class:`IndexUnavailableError` when the backend is unreachable.
    """

    model: str

    @abstractmethod
    def update(
        self, replica: Replica, *, added: Sequence[BlockRef], removed: Sequence[BlockRef]
    ) -> None:
        """Record that ``replica`` now holds ``added`` and no longer holds ``removed``
        (net changes: a reference is in at most one of them)."""

    @abstractmethod
    def clear_replica(self, replica: Replica) -> None:
        """Forget every block of ``replica``. O(blocks it held), never O(index)."""

    @abstractmethod
    def set_state(self, replica: Replica, state: str) -> None:
        """Register ``replica`` (if new) with ``state`` ("synced" or "rebuilding")."""

    @abstractmethod
    def remove_replica(self, replica: Replica) -> None:
        """Forget ``replica`` entirely (its blocks and its registration)."""

    @abstractmethod
    def replicas(self) -> dict[Replica, ReplicaState]:
        """Every registered replica and its state."""

    @abstractmethod
    def longest_prefix(
        self, group_idx: int, block_hashes: Sequence[int], *, tier: str | None = ANY_TIER
    ) -> dict[Replica, int]:
        """Per replica holding at least the first block, how many leading
        ``block_hashes`` of group ``group_idx`` it holds (on ``tier``, or any tier, mixed
        along the prefix). Stops at the first block no replica still in the race holds."""

    @abstractmethod
    def held_positions(
        self, group_idx: int, block_hashes: Sequence[int], *, tier: str | None = ANY_TIER
    ) -> dict[Replica, set[int]]:
        """Per replica, the positions ``i`` whose ``block_hashes[i]`` it holds (windowed
        groups need holes too, not just the prefix). One round trip on Redis."""

    @abstractmethod
    def blocks_of(self, replica: Replica) -> set[BlockRef]:
        """Every block reference ``replica`` holds (checks and tests)."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Assert the forward and reverse tables agree (backend specific)."""

    @abstractmethod
    def close(self) -> None:
        """Release connections. Idempotent."""


class MemoryIndex(ClusterIndex):
    """The in-process backend: dicts, no I/O, never unavailable. Not thread-safe."""

    __slots__ = ("_holders", "_owned", "_states", "model")

    def __init__(self, *, model: str) -> None:
        self.model = model
        # (group, hash) -> replica -> tiers held
        self._holders: dict[tuple[int, int], dict[Replica, set[str]]] = {}
        # replica -> its block references (the reverse table)
        self._owned: dict[Replica, set[BlockRef]] = {}
        self._states: dict[Replica, str] = {}

    def update(
        self, replica: Replica, *, added: Sequence[BlockRef], removed: Sequence[BlockRef]
    ) -> None:
        owned = self._owned.setdefault(replica, set())
        self._states.setdefault(replica, "synced")
        holders_of = self._holders
        for ref in added:
            group_idx, block_hash, tier = ref
            owned.add(ref)
            holders_of.setdefault((group_idx, block_hash), {}).setdefault(replica, set()).add(
                tier
            )
        for ref in removed:
            self._drop(replica, ref)
            owned.discard(ref)

    def _drop(self, replica: Replica, ref: BlockRef) -> None:
        group_idx, block_hash, tier = ref
        holders = self._holders.get((group_idx, block_hash))
        if holders is None:
            return
        tiers = holders.get(replica)
        if tiers is None:
            return
        tiers.discard(tier)
        if not tiers:
            del holders[replica]
            if not holders:
                del self._holders[(group_idx, block_hash)]

    def clear_replica(self, replica: Replica) -> None:
        for ref in self._owned.pop(replica, ()):
            self._drop(replica, ref)

    def set_state(self, replica: Replica, state: str) -> None:
        _check_state(state)
        self._states[replica] = state

    def remove_replica(self, replica: Replica) -> None:
        self.clear_replica(replica)
        self._states.pop(replica, None)

    def replicas(self) -> dict[Replica, ReplicaState]:
        return {
            r: ReplicaState(state=s, num_blocks=len(self._owned.get(r, ())))
            for r, s in self._states.items()
        }

    def longest_prefix(
        self, group_idx: int, block_hashes: Sequence[int], *, tier: str | None = ANY_TIER
    ) -> dict[Replica, int]:
        result: dict[Replica, int] = {}
        alive: Iterable[Replica] | None = None
        holders_of = self._holders
        for position, block_hash in enumerate(block_hashes, start=1):
            holders = holders_of.get((group_idx, block_hash))
            if not holders:
                break
            candidates = holders if alive is None else alive
            if tier is None:
                matching = [r for r in candidates if r in holders]
            else:
                matching = [r for r in candidates if tier in holders.get(r, ())]
            if not matching:
                break
            for replica in matching:
                result[replica] = position
            alive = matching
        return result

    def held_positions(
        self, group_idx: int, block_hashes: Sequence[int], *, tier: str | None = ANY_TIER
    ) -> dict[Replica, set[int]]:
        out: dict[Replica, set[int]] = {}
        for position, block_hash in enumerate(block_hashes):
            for replica, tiers in self._holders.get((group_idx, block_hash), {}).items():
                if tier is None or tier in tiers:
                    out.setdefault(replica, set()).add(position)
        return out

    def blocks_of(self, replica: Replica) -> set[BlockRef]:
        return set(self._owned.get(replica, ()))

    def check_invariants(self) -> None:
        rebuilt: dict[tuple[int, int], dict[Replica, set[str]]] = {}
        for replica, refs in self._owned.items():
            assert replica in self._states, f"{replica} holds blocks but is not registered"
            for group_idx, block_hash, tier in refs:
                rebuilt.setdefault((group_idx, block_hash), {}).setdefault(replica, set()).add(
                    tier
                )
        assert rebuilt == self._holders, "holder table out of step with the reverse table"
        for state in self._states.values():
            _check_state(state)

    def close(self) -> None:
        return None


def _check_state(state: str) -> None:
    if state not in ("synced", "rebuilding"):
        raise InvalidArgumentError(f"replica state is 'synced' or 'rebuilding', got {state!r}")
