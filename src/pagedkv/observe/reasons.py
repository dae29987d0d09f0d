"""Values of miss attribution: why each token of a lookup missed, and per-interval sums.

A :class:`LookupExplanation` splits a request's ``num_tokens`` tokens into contiguous
:class:`Segment` s, each with one :class:`Reason`; the hit segment is exactly what
``get_computed_blocks`` returns, and the segments add up to the request's token count.

Reasons (``Reason.value`` is the label used in tables and Prometheus):

* ``hit`` — served from the cache.
* ``never_seen`` — no block with this prefix is cached, was recently evicted, or is
  cached under other extra keys. Once a block is never seen, every later block of the
  same request is too (hashes are chained and registered in order), so the rest of the
  prompt is one ``never_seen`` segment.
* ``evicted`` — the block was cached and evicted (the ghost record remembers the step,
  the time and the pool usage at eviction: :class:`EvictionRecord`).
* ``isolated`` — the same tokens are cached under a different cache salt, LoRA adapter
  or multimodal key (found through a salt-free shadow hash).
* ``partial_block`` — the tail shorter than one block (of the group that limits the hit).
* ``hit_cap`` — the block(s) given up so that the last prompt token is recomputed
  (``num_tokens - 1`` cap), or the last hit block dropped for speculative decoding.
* ``clamped`` — cached for the prefix groups, but another group shortened the common
  hit: see :class:`ClampCause` and ``Segment.group``.
* ``caching_off`` — prefix caching is disabled.

>>> s = Segment(0, 32, Reason.CLAMPED, 1, ClampCause.WINDOW_RUN_NOT_FOUND, None)
>>> s.num_tokens, s.label
(32, 'clamped_window_run_not_found')
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "BlockExplanation",
    "BlockRun",
    "ClampCause",
    "EvictionRecord",
    "GroupExplanation",
    "LookupExplanation",
    "MissStats",
    "Reason",
    "Segment",
]


class Reason(str, enum.Enum):
    """Why a token hit or missed (module docstring)."""

    HIT = "hit"
    NEVER_SEEN = "never_seen"
    EVICTED = "evicted"
    ISOLATED = "isolated"
    PARTIAL_BLOCK = "partial_block"
    HIT_CAP = "hit_cap"
    CLAMPED = "clamped"
    CACHING_OFF = "caching_off"


class ClampCause(str, enum.Enum):
    """Why a group shortened a hybrid hit.

    * ``window_run_not_found`` — a sliding-window group found no run of cached blocks
      covering the window before the candidate length;
    * ``chunk_run_not_found`` — a chunked-local group misses a block of the current chunk;
    * ``lcm_alignment`` — the hit must end on every group's block boundary (the least
      common multiple of the block sizes); ``group`` is one whose boundary was not met;
    * ``no_mamba_state`` — no Mamba state is cached at that boundary (align mode caches the
      state at the last block boundary each step reaches, and a state cached in the current
      step is served only after ``new_step_starts()``), or the group keeps no states;
    * ``not_cacheable`` — the group never caches (cross attention);
    * ``group_miss`` — any other group kind missed there.
    """

    WINDOW_RUN_NOT_FOUND = "window_run_not_found"
    CHUNK_RUN_NOT_FOUND = "chunk_run_not_found"
    LCM_ALIGNMENT = "lcm_alignment"
    NO_MAMBA_STATE = "no_mamba_state"
    NOT_CACHEABLE = "not_cacheable"
    GROUP_MISS = "group_miss"


class EvictionRecord(NamedTuple):
    """When a block's hash left the prefix index: the engine's step number
    (:meth:`~pagedkv.observe.ObservedKVCacheManager.begin_step`), the clock reading in
    seconds, and the fraction of blocks in use right after the eviction."""

    step: int
    time_s: float
    usage: float


class Segment(NamedTuple):
    """Tokens ``[start, end)`` of the request and their reason.

    ``group``: the group that clamped (``clamped``) or whose block status decided
    (``evicted``/``isolated``/``never_seen``), else ``None``. ``cause``: only for
    ``clamped``. ``eviction``: only for ``evicted`` (the first evicted block of the run).
    (A named tuple rather than a dataclass: one is built per run on the lookup path.)
    """

    start: int
    end: int
    reason: Reason
    group: int | None
    cause: ClampCause | None
    eviction: EvictionRecord | None

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def label(self) -> str:
        """``reason`` or, when clamped, ``clamped_<cause>``: the key of aggregates."""
        if self.cause is not None:
            return f"clamped_{self.cause.value}"
        return self.reason.value


class BlockExplanation(NamedTuple):
    """One block position of one group: its reason, the block id on a hit (0 for a null
    block the group does not need, ``None`` on a miss), the clamp cause and the group
    that decided, and the eviction record when evicted."""

    position: int
    reason: Reason
    block_id: int | None
    cause: ClampCause | None
    group: int | None
    eviction: EvictionRecord | None


class BlockRun(NamedTuple):
    """Block positions ``[start, end)`` of one group sharing one reason (a miss run)."""

    start: int
    end: int
    reason: Reason
    cause: ClampCause | None
    group: int | None
    eviction: EvictionRecord | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupExplanation:
    """One group's view of the lookup: the hit block ids (positions ``0..len - 1``) and
    runs of missed positions up to the last full block of the prompt in this group."""

    group: int
    kind: str
    block_size: int
    hit_block_ids: tuple[int, ...]
    miss_runs: tuple[BlockRun, ...]

    def blocks(self) -> tuple[BlockExplanation, ...]:
        """One :class:`BlockExplanation` per block position. O(positions).

        >>> g = GroupExplanation(group=0, kind="full_attention", block_size=16,
        ...     hit_block_ids=(7,), miss_runs=(BlockRun(1, 3, Reason.NEVER_SEEN, None, 0,
        ...                                            None),))
        >>> [(b.position, b.reason.value, b.block_id) for b in g.blocks()]
        [(0, 'hit', 7), (1, 'never_seen', None), (2, 'never_seen', None)]
        """
        out = [BlockExplanation(i, Reason.HIT, b, None, None, None)
               for i, b in enumerate(self.hit_block_ids)]
        for r in self.miss_runs:
            out.extend(BlockExplanation(i, r.reason, None, r.cause, r.group, r.eviction)
                       for i in range(r.start, r.end))
        return tuple(out)


class LookupExplanation:
    """Why a lookup of ``request_id`` hit ``num_hit_tokens`` of its ``num_tokens``.

    ``segments`` cover ``[0, num_tokens)`` in order; :attr:`groups` has one
    :class:`GroupExplanation` per KV-cache group (empty with caching off). A read-only
    value (attributes are not to be assigned). Not a frozen dataclass on purpose: one is
    built per lookup while attribution aggregates, and a slotted class with the group
    detail derived on first access costs a third of one
    (``benchmarks/observe_speed.py``).

    >>> e = LookupExplanation("r", 40, 16, (
    ...     Segment(0, 16, Reason.HIT, None, None, None),
    ...     Segment(16, 32, Reason.NEVER_SEEN, 0, None, None),
    ...     Segment(32, 40, Reason.PARTIAL_BLOCK, None, None, None)),
    ...     unitary=("full_attention", 16, [7]))
    >>> e.missed_tokens_by_label()
    {'never_seen': 16, 'partial_block': 8}
    >>> [(b.position, b.reason.value) for b in e.groups[0].blocks()]
    [(0, 'hit'), (1, 'never_seen')]
    """

    __slots__ = ("_detail", "_groups", "_unitary", "num_hit_tokens", "num_tokens", "request_id",
                 "segments")

    def __init__(
        self,
        request_id: str,
        num_tokens: int,
        num_hit_tokens: int,
        segments: tuple[Segment, ...],
        groups: tuple[GroupExplanation, ...] = (),
        unitary: tuple[str, int, list[int]] | None = None,
        detail: Callable[[], tuple[GroupExplanation, ...]] | None = None,
    ) -> None:
        """``groups``: the per-group detail; or ``unitary`` = (kind, block size, hit
        block ids) of a single group, from which it is derived when first read; or
        ``detail``, a function building it from what the lookup read (called once, when
        first read; it must not read the manager's state then)."""
        self.request_id = request_id
        self.num_tokens = num_tokens
        self.num_hit_tokens = num_hit_tokens
        self.segments = segments
        self._groups: tuple[GroupExplanation, ...] | None = (
            None if unitary or detail else groups)
        self._unitary = unitary
        self._detail = detail

    @property
    def groups(self) -> tuple[GroupExplanation, ...]:
        if self._groups is None and self._detail is not None:
            self._groups = self._detail()
            self._detail = None
        if self._groups is None:
            assert self._unitary is not None
            kind, bs, hit_ids = self._unitary
            runs = tuple(BlockRun(s.start // bs, s.end // bs, s.reason, s.cause, s.group,
                                  s.eviction)
                         for s in self.segments
                         if s.reason is not Reason.HIT and s.end // bs > s.start // bs
                         and s.reason is not Reason.PARTIAL_BLOCK)
            self._groups = (GroupExplanation(group=0, kind=kind, block_size=bs,
                                             hit_block_ids=tuple(hit_ids), miss_runs=runs),)
        return self._groups

    def missed_tokens_by_label(self) -> dict[str, int]:
        """Missed tokens per segment label (hit segments left out). O(segments)."""
        out: dict[str, int] = {}
        for s in self.segments:
            if s.reason is not Reason.HIT:
                out[s.label] = out.get(s.label, 0) + s.end - s.start
        return out

    def __repr__(self) -> str:
        return (f"LookupExplanation({self.request_id!r}, num_tokens={self.num_tokens}, "
                f"num_hit_tokens={self.num_hit_tokens}, segments={self.segments!r})")


@dataclass(frozen=True, slots=True, kw_only=True)
class MissStats:
    """Lookups since the previous ``make_miss_stats`` call: tokens queried and hit, and
    missed tokens by label (:attr:`Segment.label`); preempted re-lookups apart, as in
    :class:`pagedkv.PrefixCacheStats`. ``queries == hits + sum(missed_tokens.values())``.
    """

    requests: int
    queries: int
    hits: int
    missed_tokens: Mapping[str, int]
    preempted_requests: int
    preempted_queries: int
    preempted_hits: int
    preempted_missed_tokens: Mapping[str, int]

