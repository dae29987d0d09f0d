"""Retention values: what a request asks for, and how a manager's retention is configured.

Priorities follow TensorRT-LLM's ``KvCacheRetentionConfig``: an int in ``[0, 100]``,
default 35; a free cached block of a lower priority is evicted before one of a higher
priority, LRU within one priority. A range may carry a duration: once the block becomes
reusable (its last holder freed it), the priority lasts that many seconds, then reverts to
the default.

Per block, a request's priority is the highest priority among the ranges the block
overlaps (decode tokens, those at or after ``num_prompt_tokens``, form one more range with
``decode_priority``); the duration is that of the range which gave the priority (the
longest among equals; ``None``, i.e. forever, wins).

>>> r = RequestRetention(ranges=(TokenRangeRetention(token_start=0, token_end=32,
...                                                  priority=90, duration_s=60.0),),
...                      decode_priority=10)
>>> [r.block_retention(i, 16, num_prompt_tokens=40) for i in range(4)]
[(90, 60.0), (90, 60.0), (35, None), (10, None)]
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pagedkv.arg_types import MAX_SECONDS, check_fields
from pagedkv.checks import check_clock, check_flag, check_text, check_whole
from pagedkv.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "RequestRetention",
    "RetentionSettings",
    "TokenRangeRetention",
    "read_clock",
]

MIN_PRIORITY = 0
MAX_PRIORITY = 100
#: TensorRT-LLM's default retention priority.
DEFAULT_PRIORITY = 35


def _check_priority(what: str, p: object) -> None:
    if not isinstance(p, int) or isinstance(p, bool) or not MIN_PRIORITY <= p <= MAX_PRIORITY:
        raise InvalidArgumentError(
            f"{what} must be an int in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {p!r}"
        )


def _check_duration(what: str, d: object) -> None:
    if d is None:
        return
    if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0 < d <= MAX_SECONDS:
        raise InvalidArgumentError(
            f"{what} must be a positive number of seconds up to {MAX_SECONDS:.0e} or None, "
            f"got {d!r}"
        )


def read_clock(clock: Callable[[], float], not_before: float) -> float:
    """``clock()``, held at ``not_before`` if it went back (a wall clock stepped back, a
    simulator's clock reset): time on the retention clock never runs backwards, so no
    deadline passes twice and no expiry is undone.

    >>> read_clock(lambda: 5.0, 7.0), read_clock(lambda: 9.0, 7.0)
    (7.0, 9.0)

    Raises:
        InvalidArgumentError: the clock returned something other than a finite number
            of seconds (``RetentionConfig.clock`` must, e.g. ``time.monotonic``).
    """
    now = clock()
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise InvalidArgumentError(
            f"the retention clock returned {now!r:.60}; RetentionConfig.clock must return "
            "seconds as a finite number (e.g. time.monotonic)")
    return now if now >= not_before else not_before


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRangeRetention:
    """Priority (and optional duration) of prompt tokens ``[token_start, token_end)``;
    ``token_end=None`` runs to the end of the prompt.

    Raises:
        InvalidArgumentError: a negative start, an end not after the start, a priority
            outside ``[0, 100]`` or a non-positive duration.
    """

    token_start: int = 0
    token_end: int | None = None
    priority: int = DEFAULT_PRIORITY
    duration_s: float | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if type(self.token_start) is not int or self.token_start < 0:
            raise InvalidArgumentError(
                f"token_start must be an int >= 0, got {self.token_start!r}"
            )
        if self.token_end is not None and (
            type(self.token_end) is not int or self.token_end <= self.token_start
        ):
            raise InvalidArgumentError(
                f"token_end must be None or an int > token_start ({self.token_start}), "
                f"got {self.token_end!r}"
            )
        _check_priority("priority", self.priority)
        _check_duration("duration_s", self.duration_s)


def _better(p: int, d: float | None, best_p: int, best_d: float | None) -> bool:
    """Whether (p, d) beats (best_p, best_d): higher priority, then longer duration."""
    if p != best_p:
        return p > best_p
    if best_d is None:
        return False
    return d is None or d > best_d


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRetention:
    """What one request asks the cache to do with its blocks once they are free.

    ``ranges``: priorities of prompt token ranges (tokens no range covers get
    ``default_priority``); ``decode_priority`` / ``decode_duration_s``: the same for the
    generated tokens.
    """

    ranges: tuple[TokenRangeRetention, ...] = ()
    decode_priority: int = DEFAULT_PRIORITY
    decode_duration_s: float | None = None
    default_priority: int = DEFAULT_PRIORITY
    #: Derived once (not compared): the prompt cut into segments no range boundary
    #: splits, ``(start, priority, duration_s)`` in order, the last open-ended.
    _segments: tuple[tuple[int, int, float | None], ...] = field(
        init=False, repr=False, compare=False)
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: Whether any range, or the decode setting, has a duration (derived).
    has_durations: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.ranges, tuple):
            raise InvalidArgumentError(
                f"ranges must be a tuple of TokenRangeRetention, got {type(self.ranges).__name__}"
            )
        for r in self.ranges:
            if not isinstance(r, TokenRangeRetention):
                raise InvalidArgumentError(
                    f"ranges holds {r!r}; each entry must be a TokenRangeRetention"
                )
        _check_priority("decode_priority", self.decode_priority)
        _check_duration("decode_duration_s", self.decode_duration_s)
        _check_priority("default_priority", self.default_priority)
        points = {0}
        for r in self.ranges:
            points.add(r.token_start)
            if r.token_end is not None:
                points.add(r.token_end)
        cuts = sorted(points)
        segments = tuple(
            (a, *self._segment_retention(a, b))
            for a, b in zip(cuts, [*cuts[1:], None], strict=True)
        )
        object.__setattr__(self, "_segments", segments)
        object.__setattr__(self, "_starts", tuple(a for a, _, _ in segments))
        object.__setattr__(self, "has_durations", self.decode_duration_s is not None or any(
            r.duration_s is not None for r in self.ranges))

    def block_retention(
        self, index: int, block_size: int, *, num_prompt_tokens: int
    ) -> tuple[int, float | None]:
        """``(priority, duration_s)`` of the block holding tokens
        ``[index * block_size, (index + 1) * block_size)``. O(ranges)."""
        start = index * block_size
        end = start + block_size
        prompt_end = min(end, num_prompt_tokens)
        best_p = -1
        best_d: float | None = 0.0
        pieces: list[tuple[int, int]] = []
        for r in self.ranges:
            r_end = num_prompt_tokens if r.token_end is None else min(r.token_end,
                                                                      num_prompt_tokens)
            lo = max(start, r.token_start)
            hi = min(prompt_end, r_end)
            if lo < hi:
                pieces.append((lo, hi))
                if _better(r.priority, r.duration_s, best_p, best_d):
                    best_p, best_d = r.priority, r.duration_s
        if start < prompt_end and _has_gap(pieces, start, prompt_end) and _better(
            self.default_priority, None, best_p, best_d
        ):
            best_p, best_d = self.default_priority, None
        if end > num_prompt_tokens and _better(self.decode_priority, self.decode_duration_s,
                                               best_p, best_d):
            best_p, best_d = self.decode_priority, self.decode_duration_s
        return best_p, best_d

    def blocks_retention(
        self, num_blocks: int, block_size: int, *, num_prompt_tokens: int
    ) -> tuple[list[int], list[float | None]]:
        """Priorities and durations of blocks ``0 .. num_blocks - 1`` (as
        :meth:`block_retention` for each), in O(num_blocks + ranges^2): the
        :meth:`block_runs` expanded.

        >>> r = RequestRetention(ranges=(TokenRangeRetention(token_end=20, priority=80),))
        >>> r.blocks_retention(4, 16, num_prompt_tokens=40)
        ([80, 80, 35, 35], [None, None, None, None])
        """
        prios: list[int] = []
        durs: list[float | None] = []
        for a, b, p, d in self.block_runs(num_blocks, block_size,
                                          num_prompt_tokens=num_prompt_tokens):
            prios += [p] * (b - a)
            durs += [d] * (b - a)
        return prios, durs

    def block_runs(
        self, num_blocks: int, block_size: int, *, num_prompt_tokens: int
    ) -> list[tuple[int, int, int, float | None]]:
        """:meth:`blocks_retention` as runs ``(first, stop, priority, duration_s)`` of
        equal retention covering block indexes ``0 .. num_blocks - 1`` in order (adjacent
        runs may be equal), without a per-block list. O(ranges^2), independent of
        ``num_blocks``: a request's blocks take their retention run by run.

        >>> r = RequestRetention(ranges=(TokenRangeRetention(token_end=40, priority=80,
        ...                                                  duration_s=9.0),),
        ...                      decode_priority=20)
        >>> r.block_runs(6, 16, num_prompt_tokens=72)
        [(0, 3, 80, 9.0), (3, 5, 35, None), (5, 6, 20, None)]
        """
        prompt = num_prompt_tokens
        segs = self._segments
        # The precomputed segments starting before the prompt's end, the last one cut
        # there (it keeps its retention: a range ending after its start ends at or after
        # the next cut), then the decode tokens. Segments are contiguous token spans in
        # order; a block holding a cut belongs to the segments on both sides and takes
        # the better retention (the earlier one on a tie). Only the last run can hold a
        # block the next segment starts in.
        j = bisect_left(self._starts, prompt)
        runs: list[tuple[int, int, int, float | None]] = []
        for i in range(j + 1):
            if i < j:
                a, p, d = segs[i]
                b = segs[i + 1][0] if i + 1 < j else prompt
            else:
                a, b = prompt, max(prompt, num_blocks * block_size)
                p, d = self.decode_priority, self.decode_duration_s
            first = a // block_size
            last = min((b - 1) // block_size, num_blocks - 1)
            if b <= a or first > last:
                continue
            if runs and runs[-1][1] > first:  # block `first` is already in the last run
                s0, e0, p0, d0 = runs[-1]
                if _better(p, d, p0, d0):
                    if e0 - 1 > s0:
                        runs[-1] = (s0, e0 - 1, p0, d0)
                    else:
                        runs.pop()
                    runs.append((first, last + 1, p, d))
                elif last > first:
                    runs.append((first + 1, last + 1, p, d))
            else:
                runs.append((first, last + 1, p, d))
        return runs

    def _segment_retention(self, a: int, b: int | None) -> tuple[int, float | None]:
        """The best retention of the ranges covering tokens ``[a, b)`` (``b`` None: to
        the end of any prompt), which no range boundary cuts, or the default."""
        best_p: int = -1
        best_d: float | None = 0.0
        best: tuple[int, float | None] = (self.default_priority, None)
        for r in self.ranges:
            covers = r.token_end is None or (b is not None and b <= r.token_end)
            if r.token_start <= a and covers and _better(r.priority, r.duration_s,
                                                         best_p, best_d):
                best_p, best_d = r.priority, r.duration_s
                best = (best_p, best_d)
        return best


def _has_gap(pieces: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether the union of ``pieces`` misses a token of ``[start, end)``."""
    pos = start
    for lo, hi in sorted(pieces):
        if lo > pos:
            return True
        pos = max(pos, hi)
    return pos < end


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionSettings:
    """The fields of :class:`pagedkv.retention.RetentionConfig` and their checks.

    ``pin_budget_fraction``: pinned prefix blocks may take at most this fraction of the
    pool's usable blocks; a pin that would exceed it is refused
    (:class:`~pagedkv.errors.PinBudgetError`).
    ``preempt_pins``: whether free pinned blocks count as free capacity. ``False``
    (default): a free pinned block is neither evictable nor counted as free (it counts as
    in use in ``num_free_blocks`` and ``usage``). ``True``: it counts as free and is
    evicted last, after every unpinned block, losing its pin.
    ``tenant_quota_blocks``: per tenant (the request's cache salt; ``None`` for unsalted
    requests), the most free cached blocks it keeps at normal priority; blocks past the
    quota become the next eviction candidates after unhashed blocks, the tenant's lowest
    priority, least recently freed first. ``default_tenant_quota_blocks`` applies to
    tenants not listed (``None``: no quota).
    ``clock``: seconds, monotone (``time.monotonic`` by default; the simulator passes its
    simulated clock).

    Raises:
        InvalidArgumentError: a budget outside ``(0, 1]``, a negative quota, or a default
            priority outside ``[0, 100]``.
    """

    default_priority: int = DEFAULT_PRIORITY
    pin_budget_fraction: float = 0.25
    preempt_pins: bool = False
    tenant_quota_blocks: Mapping[str | None, int] = field(default_factory=dict)
    default_tenant_quota_blocks: int | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        _check_priority("default_priority", self.default_priority)
        f = self.pin_budget_fraction
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f <= 1:
            raise InvalidArgumentError(
                f"pin_budget_fraction must be in (0, 1], got {f!r}"
            )
        check_flag("RetentionConfig.preempt_pins", self.preempt_pins)
        if not isinstance(self.tenant_quota_blocks, Mapping):
            raise InvalidArgumentError(
                f"tenant_quota_blocks must be a mapping of tenant (cache salt or None) to "
                f"blocks, got {self.tenant_quota_blocks!r}")
        quotas = dict(self.tenant_quota_blocks)
        if self.default_tenant_quota_blocks is not None:
            quotas["(default)"] = self.default_tenant_quota_blocks
        for tenant, q in quotas.items():
            if tenant is not None and tenant != "(default)":
                check_text("a tenant of tenant_quota_blocks", tenant)
            check_whole(f"quota of tenant {tenant!r}", q, minimum=0)
        check_clock("RetentionConfig.clock", self.clock)

    @property
    def has_quotas(self) -> bool:
        """Whether any tenant has a quota."""
        return bool(self.tenant_quota_blocks) or self.default_tenant_quota_blocks is not None

    def quota_of(self, tenant: str | None) -> int | None:
        """The quota of ``tenant`` in blocks, or None (unlimited)."""
        q = self.tenant_quota_blocks.get(tenant)
        return self.default_tenant_quota_blocks if q is None else q
