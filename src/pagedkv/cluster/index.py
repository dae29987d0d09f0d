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

import hashlib
import time
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
    "WriterConflictError",
    "ref_digest",
    "ref_member",
]

BlockRef = tuple[int, int, str]
"""``(group_idx, wire hash as u64, tier)`` of one block on one replica."""

ANY_TIER = None
"""``tier`` argument of lookups that accept a block on any tier."""

_SEP = "|"

DIGEST_MODULUS = 1 << 48
"""Block-set digests are sums modulo 2**48 (exact in Redis's Lua numbers, doubles)."""


def ref_member(ref: BlockRef) -> str:
    """A block reference as a replica's reverse-set member: ``<group>:<hash hex>|<tier>``.

    >>> ref_member((0, 255, "GPU"))
    '0:00000000000000ff|GPU'
    """
    group_idx, block_hash, tier = ref
    return f"{group_idx}:{block_hash:016x}|{tier}"


def ref_digest(ref: BlockRef) -> int:
    """A block reference's share of its replica's digest: the first 48 bits of the SHA-1
    of :func:`ref_member`. A replica's digest is the sum of its references' shares modulo
    :data:`DIGEST_MODULUS` (order-free, updated per change; the Redis backend computes the
    same sum server-side), so two block sets that differ in content almost surely differ
    in digest even when their sizes are equal."""
    return int(hashlib.sha1(ref_member(ref).encode()).hexdigest()[:12], 16)


class IndexUnavailableError(PagedKVError):
    """The index backend cannot be reached (e.g. Redis is down). Callers degrade: the
    router routes by load alone, the ingest keeps counting and rewrites the index when
    the backend is back."""


class WriterConflictError(PagedKVError):
    """An update under a writer lease that another writer holds: the replica is written
    by another ingest (``holder``); nothing was written. The ingest stands by."""

    def __init__(self, message: str, *, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


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
    the block references it holds, ``digest`` the sum of their :func:`ref_digest` shares
    modulo :data:`DIGEST_MODULUS` (what :meth:`IndexIngest.heal
    <pagedkv.cluster.ingest.IndexIngest.heal>` compares with its own)."""

    state: str
    num_blocks: int
    digest: int = 0


class ClusterIndex(ABC):
    """Presence of blocks on replicas, for one model (``model`` namespaces the data).

    Writers: one ingest per replica, made single by a *writer lease* per replica
    (:meth:`claim_writer`; an ingest that does not hold it stands by and takes over when
    the holder stops renewing it). Readers: any number of routers. Every method may raise
    :class:`IndexUnavailableError` when the backend is unreachable.
    """

    model: str

    @abstractmethod
    def update(
        self, replica: Replica, *, added: Sequence[BlockRef], removed: Sequence[BlockRef],
        writer: str | None = None,
    ) -> None:
        """Record that ``replica`` now holds ``added`` and no longer holds ``removed``
        (net changes: a reference is in at most one of them). With ``writer``, only if
        ``writer`` holds the replica's lease (checked atomically with the write), else
        :class:`WriterConflictError` and nothing is written."""

    @abstractmethod
    def claim_writer(self, replica: Replica, writer: str, ttl_s: float) -> str | None:
        """Take or renew ``replica``'s writer lease for ``writer`` for ``ttl_s`` seconds;
        returns None when ``writer`` holds it now, else the holder's id (the lease ends
        ``ttl_s`` after the holder's last renewal)."""

    @abstractmethod
    def release_writer(self, replica: Replica, writer: str) -> None:
        """End ``writer``'s lease on ``replica`` (nothing if another writer holds it)."""

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
    """The in-process backend: dicts, no I/O, never unavailable. Not thread-safe.

    Layout: ``(group, hash)`` → replica key → bit mask of the tiers held there, and per
    replica key the set of its block references (the reverse table). Replica keys are
    strings, so the hot loops hash cached strings only.
    """

    __slots__ = ("_digests", "_holders", "_leases", "_owned", "_replicas", "_states",
                 "_tier_bits", "model")

    def __init__(self, *, model: str) -> None:
        self.model = model
        self._holders: dict[tuple[int, int], dict[str, int]] = {}
        self._owned: dict[str, set[BlockRef]] = {}
        self._states: dict[str, str] = {}
        self._replicas: dict[str, Replica] = {}
        self._tier_bits: dict[str, int] = {}
        self._digests: dict[str, int] = {}
        self._leases: dict[str, tuple[str, float]] = {}  # replica key -> writer, expiry

    def claim_writer(self, replica: Replica, writer: str, ttl_s: float) -> str | None:
        now = time.monotonic()
        holder, expires_s = self._leases.get(replica.key, (writer, now))
        if holder != writer and expires_s > now:
            return holder
        self._leases[replica.key] = (writer, now + ttl_s)
        return None

    def release_writer(self, replica: Replica, writer: str) -> None:
        if self._leases.get(replica.key, ("",))[0] == writer:
            del self._leases[replica.key]

    def _bit(self, tier: str) -> int:
        bit = self._tier_bits.get(tier)
        if bit is None:
            bit = self._tier_bits[tier] = 1 << len(self._tier_bits)
        return bit

    def _register(self, replica: Replica) -> str:
        key = replica.key
        if key not in self._replicas:
            self._replicas[key] = replica
            self._states.setdefault(key, "synced")
            self._owned[key] = set()
        return key

    def update(
        self, replica: Replica, *, added: Sequence[BlockRef], removed: Sequence[BlockRef],
        writer: str | None = None,
    ) -> None:
        if writer is not None:
            holder, expires_s = self._leases.get(replica.key, ("", 0.0))
            if holder != writer or expires_s <= time.monotonic():
                raise WriterConflictError(
                    f"{replica.key}: writer {writer!r} does not hold the writer lease "
                    f"(holder: {holder or 'nobody'})", holder=holder)
        rkey = self._register(replica)
        owned = self._owned[rkey]
        holders_of = self._holders
        bits = self._tier_bits
        digest = self._digests.get(rkey, 0)
        for ref in added:
            group_idx, block_hash, tier = ref
            bit = bits.get(tier) or self._bit(tier)
            if ref not in owned:
                digest += ref_digest(ref)
            owned.add(ref)
            holders = holders_of.get((group_idx, block_hash))
            if holders is None:
                holders_of[(group_idx, block_hash)] = {rkey: bit}
            else:
                holders[rkey] = holders.get(rkey, 0) | bit
        for ref in removed:
            if ref in owned:
                owned.discard(ref)
                self._drop(rkey, ref)
                digest -= ref_digest(ref)
        self._digests[rkey] = digest % DIGEST_MODULUS

    def _drop(self, rkey: str, ref: BlockRef) -> None:
        group_idx, block_hash, tier = ref
        holders = self._holders[(group_idx, block_hash)]
        mask = holders[rkey] & ~self._tier_bits[tier]
        if mask:
            holders[rkey] = mask
        else:
            del holders[rkey]
            if not holders:
                del self._holders[(group_idx, block_hash)]

    def clear_replica(self, replica: Replica) -> None:
        rkey = replica.key
        owned = self._owned.get(rkey)
        if owned:
            for ref in owned:
                self._drop(rkey, ref)
            owned.clear()
        self._digests.pop(rkey, None)

    def set_state(self, replica: Replica, state: str) -> None:
        _check_state(state)
        self._states[self._register(replica)] = state

    def remove_replica(self, replica: Replica) -> None:
        self.clear_replica(replica)
        rkey = replica.key
        for table in (self._states, self._replicas, self._owned):
            table.pop(rkey, None)

    def replicas(self) -> dict[Replica, ReplicaState]:
        return {
            self._replicas[k]: ReplicaState(state=s, num_blocks=len(self._owned[k]),
                                            digest=self._digests.get(k, 0))
            for k, s in self._states.items()
        }

    def longest_prefix(
        self, group_idx: int, block_hashes: Sequence[int], *, tier: str | None = ANY_TIER
    ) -> dict[Replica, int]:
        counts: dict[str, int] = {}
        alive: Iterable[str] | None = None
        holders_of = self._holders
        want = -1 if tier is None else self._tier_bits.get(tier, 0)
        for position, block_hash in enumerate(block_hashes, start=1):
            holders = holders_of.get((group_idx, block_hash))
            if not holders:
                break
            candidates = holders if alive is None else alive
            matching = [r for r in candidates if holders.get(r, 0) & want]
            if not matching:
                break
            for rkey in matching:
                counts[rkey] = position
            alive = matching
        return {self._replicas[k]: n for k, n in counts.items()}

    def held_positions(
        self, group_idx: int, block_hashes: Sequence[int], *, tier: str | None = ANY_TIER
    ) -> dict[Replica, set[int]]:
        out: dict[str, set[int]] = {}
        want = -1 if tier is None else self._tier_bits.get(tier, 0)
        for position, block_hash in enumerate(block_hashes):
            for rkey, mask in self._holders.get((group_idx, block_hash), {}).items():
                if mask & want:
                    out.setdefault(rkey, set()).add(position)
        return {self._replicas[k]: p for k, p in out.items()}

    def blocks_of(self, replica: Replica) -> set[BlockRef]:
        return set(self._owned.get(replica.key, ()))

    def check_invariants(self) -> None:
        rebuilt: dict[tuple[int, int], dict[str, int]] = {}
        for rkey, refs in self._owned.items():
            assert rkey in self._states and rkey in self._replicas, f"{rkey} not registered"
            for group_idx, block_hash, tier in refs:
                holders = rebuilt.setdefault((group_idx, block_hash), {})
                holders[rkey] = holders.get(rkey, 0) | self._tier_bits[tier]
        assert rebuilt == self._holders, "holder table out of step with the reverse table"
        for rkey, refs in self._owned.items():
            expected = sum(ref_digest(r) for r in refs) % DIGEST_MODULUS
            assert self._digests.get(rkey, 0) == expected, f"{rkey}: digest out of step"
        for state in self._states.values():
            _check_state(state)

    def close(self) -> None:
        return None


def _check_state(state: str) -> None:
    if state not in ("synced", "rebuilding"):
        raise InvalidArgumentError(f"replica state is 'synced' or 'rebuilding', got {state!r}")
