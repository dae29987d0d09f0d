"""What the façade's call modules see of the façade: :class:`Facade`, the state a
:class:`pagedkv.KVCacheManager` holds.

The façade's calls live in modules by concern (:mod:`~pagedkv.core.facade_lookups`,
:mod:`~pagedkv.core.facade_allocation`, :mod:`~pagedkv.core.facade_frees`,
:mod:`~pagedkv.core.facade_queries`, :mod:`~pagedkv.core.facade_events`), each a function
taking the manager; the class holds them as its methods. They name the manager by this
protocol, so none imports the class (no import circle), and mypy checks that the class
has every field they read.
"""

from __future__ import annotations

from typing import Protocol

from pagedkv.core.components import EventPublisher, Hooks, ManagerComponent
from pagedkv.core.config import CacheConfig
from pagedkv.core.coordinator import ComputedBlocks, Coordinator
from pagedkv.core.hashing import BlockHasher
from pagedkv.core.held_blocks import HeldBlocks
from pagedkv.core.managers import SingleTypeManager
from pagedkv.core.metrics import HitRateWindow, LookupCounters
from pagedkv.core.pool import BlockPool
from pagedkv.core.recorder import EventRecorder
from pagedkv.core.request import RequestLike

__all__ = ["Facade"]


class Facade(Protocol):
    """The fields of :class:`pagedkv.KVCacheManager` its call modules use (each
    documented on the class)."""

    config: CacheConfig
    max_model_len: int
    watermark_blocks: int
    pool: BlockPool
    recorder: EventRecorder
    hasher: BlockHasher
    managers: list[SingleTypeManager]
    coordinator: Coordinator
    held: HeldBlocks
    issuer_token: object
    _empty_hit: ComputedBlocks
    live_requests: dict[str, RequestLike]
    lookups: LookupCounters
    hit_rate_window: HitRateWindow
    components: tuple[ManagerComponent, ...]
    _hooks: Hooks
    publisher: EventPublisher | None

    def require_live(self, request_id: str) -> None: ...
