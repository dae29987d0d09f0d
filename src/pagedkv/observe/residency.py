"""Block residency, sampled: how long blocks live, how long they sit idle before they are
evicted, and the gaps between their reuses — the three histograms vLLM 0.33 reports
(``kv_block_lifetime_seconds``, ``kv_block_idle_before_evict_seconds``,
``kv_block_reuse_gap_seconds``), with the same definitions:

* a block is *born* when it is allocated (taken from the free queue); 1 in
  ``sample_every`` allocations is followed (deterministic counter, not random);
* an *access* is a prefix-cache hit claiming it (``touch``); the last 4 access times are
  kept;
* it *dies* when it is allocated again (its content is evicted); then one
  :class:`ResidencySample` is emitted: lifetime = death - birth, idle = death -
  last access (birth when never accessed), reuse gaps = differences of the kept access
  times. A cache reset stops following every block without emitting (as vLLM).

:class:`ResidencyListener` feeds a sampler from the pool (a pool listener, see
:mod:`pagedkv.core.components`; without it the pool has none).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pagedkv.core.components import PoolListener
from pagedkv.errors import InvalidArgumentError

__all__ = ["ResidencyListener", "ResidencySample", "ResidencySampler"]

_ACCESS_HISTORY = 4


class ResidencySample(NamedTuple):
    """One followed block's life, in seconds of the sampler's clock."""

    lifetime_s: float
    idle_before_evict_s: float
    reuse_gaps_s: tuple[float, ...]


class _Followed:
    __slots__ = ("accesses", "birth_s", "last_access_s")

    def __init__(self, now: float) -> None:
        self.birth_s = now
        self.last_access_s = now
        self.accesses: deque[float] = deque(maxlen=_ACCESS_HISTORY)


class ResidencySampler:
    """Follows 1 in ``sample_every`` allocated blocks (module docstring).

    >>> t = [0.0]
    >>> s = ResidencySampler(1, clock=lambda: t[0])
    >>> s.allocated([5]); t[0] = 2.0; s.accessed([5]); t[0] = 3.0; s.accessed([5])
    >>> t[0] = 10.0; s.allocated([5])   # block 5 reused: its first life ends
    >>> s.drain()
    [ResidencySample(lifetime_s=10.0, idle_before_evict_s=7.0, reuse_gaps_s=(1.0,))]

    Raises:
        InvalidArgumentError: ``sample_every < 1``.
    """

    def __init__(self, sample_every: int, *, clock: Callable[[], float]) -> None:
        if not isinstance(sample_every, int) or sample_every < 1:
            raise InvalidArgumentError(
                f"residency sample_every must be an int >= 1, got {sample_every!r}"
            )
        self.sample_every = sample_every
        self.clock = clock
        self._countdown = 1  # the first allocation is followed
        self._followed: dict[int, _Followed] = {}
        self._samples: list[ResidencySample] = []

    @property
    def num_followed(self) -> int:
        return len(self._followed)

    def allocated(self, ids: Sequence[int]) -> None:
        """Blocks taken from the free queue: followed ones die, some are born followed.
        O(followed blocks among ``ids`` + newly followed), the rest at C speed."""
        followed = self._followed
        now: float | None = None
        if followed:
            dead = followed.keys() & ids
            if dead:
                now = self.clock()
                for b in dead:
                    self._emit(followed.pop(b), now)
        n = len(ids)
        countdown = self._countdown
        if countdown > n:
            self._countdown = countdown - n
            return
        now = self.clock() if now is None else now
        every = self.sample_every
        for j in range(countdown - 1, n, every):
            followed[ids[j]] = _Followed(now)
        self._countdown = every - (n - countdown) % every

    def accessed(self, ids: Sequence[int]) -> None:
        """Blocks claimed by a prefix-cache hit."""
        followed = self._followed
        if not followed:
            return
        hot = followed.keys() & ids
        if hot:
            now = self.clock()
            for b in hot:
                state = followed[b]
                state.last_access_s = now
                state.accesses.append(now)

    def reset(self) -> None:
        """The cache was reset: stop following every block (nothing emitted)."""
        self._followed.clear()

    def _emit(self, state: _Followed, now: float) -> None:
        a = list(state.accesses)
        gaps = tuple(a[i] - a[i - 1] for i in range(1, len(a)))
        self._samples.append(
            ResidencySample(now - state.birth_s, now - state.last_access_s, gaps)
        )

    def drain(self) -> list[ResidencySample]:
        """The samples emitted since the previous call."""
        out = self._samples
        self._samples = []
        return out


class ResidencyListener(PoolListener):
    """Tells ``sampler`` about the pool's allocations, prefix-cache hits and resets (a
    pool listener: block ids, hits and evictions are unchanged)."""

    def __init__(self, sampler: ResidencySampler) -> None:
        self.sampler = sampler

    def allocated(self, ids: list[int]) -> None:
        self.sampler.allocated(ids)

    def touched(self, ids: Sequence[int]) -> None:
        self.sampler.accessed(ids)

    def cleared(self) -> None:
        self.sampler.reset()
