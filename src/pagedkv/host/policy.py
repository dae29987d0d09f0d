"""When the host tier stores a block: the write policy (a class each) and the admission
rule (a class each).

Write policies:

* :class:`StoreOnEviction` (default) — a device block is copied to the host when the
  device pool evicts it (hands it to another request). The copy must run before that
  request's step writes into the block: the plan's timing is ``before_forward``.
* :class:`WriteThrough` — a device block is copied to the host as soon as it is registered
  in the prefix index; the step being scheduled computes it, so the copy runs after the
  forward pass (timing ``after_forward``). Eviction then finds the block already stored.

Admission rules:

* :class:`AdmitAll` (default) — every offered block is stored.
* :class:`AdmitAfterHits` — a block is stored only once requests adopted it as a prefix
  hit (device or host) ``min_hits`` times; hit counts are kept for the
  ``max_tracked_keys`` most recently hit keys.

>>> t = AdmitAfterHits(min_hits=2).tracker()
>>> k = (b"h", 0)
>>> t.admits(k), t.on_hits([k]), t.admits(k), t.on_hits([k]), t.admits(k)
(False, None, False, None, True)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from pagedkv.core.components import DeviceBlock
from pagedkv.errors import InvalidArgumentError
from pagedkv.host.plans import AFTER_FORWARD, BEFORE_FORWARD, HostKey


class HostTier(Protocol):
    """What a write policy asks of the host tier (:class:`pagedkv.host.tier.HostTier`)."""

    def offer_stores(self, blocks: list[DeviceBlock], timing: str) -> object: ...

__all__ = [
    "AdmissionRule",
    "AdmitAfterHits",
    "AdmitAll",
    "HitTracker",
    "StoreOnEviction",
    "WritePolicy",
    "WriteThrough",
]


class WritePolicy:
    """What the host tier does when the device evicts or registers blocks."""

    def on_device_evicted(self, tier: HostTier, blocks: list[DeviceBlock]) -> None:
        """Device blocks (id, hash, group) just evicted, in eviction order."""

    def on_device_registered(self, tier: HostTier, blocks: list[DeviceBlock]) -> None:
        """Device blocks (id, hash, group) just registered in the prefix index."""


@dataclass(frozen=True, slots=True)
class StoreOnEviction(WritePolicy):
    """Store a block when the device evicts it (the default)."""

    def on_device_evicted(self, tier: HostTier, blocks: list[DeviceBlock]) -> None:
        tier.offer_stores(blocks, BEFORE_FORWARD)


@dataclass(frozen=True, slots=True)
class WriteThrough(WritePolicy):
    """Store a block as soon as the device registers it."""

    def on_device_registered(self, tier: HostTier, blocks: list[DeviceBlock]) -> None:
        tier.offer_stores(blocks, AFTER_FORWARD)


class HitTracker:
    """Hit counts of the ``max_tracked_keys`` most recently hit keys."""

    __slots__ = ("counts", "max_tracked_keys", "min_hits")

    def __init__(self, min_hits: int, max_tracked_keys: int) -> None:
        self.min_hits = min_hits
        self.max_tracked_keys = max_tracked_keys
        self.counts: OrderedDict[HostKey, int] = OrderedDict()

    def on_hits(self, keys: Iterable[HostKey]) -> None:
        """One more hit on each key (each key once per call)."""
        counts = self.counts
        for k in keys:
            n = counts.pop(k, 0) + 1
            counts[k] = n
            if len(counts) > self.max_tracked_keys:
                counts.popitem(last=False)

    def admits(self, key: HostKey) -> bool:
        return self.counts.get(key, 0) >= self.min_hits


class AdmissionRule:
    """Decides which offered blocks are stored; :meth:`tracker` builds its state."""

    def tracker(self) -> HitTracker | None:
        """The state this rule keeps (``None``: none, every block is admitted)."""
        return None


@dataclass(frozen=True, slots=True)
class AdmitAll(AdmissionRule):
    """Store every offered block (the default)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmitAfterHits(AdmissionRule):
    """Store a block only after it was hit ``min_hits`` times (``>= 1``).

    Raises:
        InvalidArgumentError: ``min_hits`` or ``max_tracked_keys`` below 1.
    """

    min_hits: int
    max_tracked_keys: int = 65536

    def __post_init__(self) -> None:
        for name in ("min_hits", "max_tracked_keys"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise InvalidArgumentError(f"AdmitAfterHits.{name} must be an int >= 1, got {v!r}")

    def tracker(self) -> HitTracker:
        return HitTracker(self.min_hits, self.max_tracked_keys)
