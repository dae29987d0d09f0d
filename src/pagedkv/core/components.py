"""How features attach to the exact engine: components with explicit callbacks.

The core knows no feature. A feature (retention, a host tier, miss attribution, an event
publisher) is configured by a *component spec*, a value in one of
:class:`~pagedkv.core.config.CacheConfig`'s component fields. The factory
(:mod:`pagedkv.core.factory`) hands every spec one :class:`ManagerBuild` before anything
exists, and the spec says what it needs of the pool:

* wrap the event recorder (``build.recorder = MyRecorder(build.recorder)``: it hears of
  every registration, eviction and reset, once per run of blocks);
* add a :class:`PoolListener` (told of evictions with block ids, allocations, hits and
  resets);
* supply the :class:`EvictionPolicy` (the order free blocks are reused in; one at most).

It returns its :class:`ManagerComponent`, which the façade calls at fixed points (after a
lookup, before an allocation, before a free, when events are taken, in the checks) and
exposes as an attribute named by :attr:`ManagerComponent.name` (``mgr.retention``,
``mgr.host``, ``mgr.observe``). Any subset combines. An absent component costs nothing
on the hot path beyond one truth test of an empty tuple per call that could reach it.

Worked case: a spec that counts evicted blocks::

    class CountEvictions(PoolListener):
        def __init__(self) -> None: self.n = 0
        def evicted(self, blocks): self.n += len(blocks)

    class CountSpec:                          # any object with attach() is a spec
        def attach(self, build):
            listener = CountEvictions()
            build.listeners.append(listener)
            return ManagerComponent("evictions")   # mgr.evictions

(:class:`~pagedkv.core.config.CacheConfig` takes such a spec in ``components``.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pagedkv.core.recorder import EventRecorder, GroupInfo
from pagedkv.core.records import BlockStored, KVCacheEvent

if TYPE_CHECKING:
    from pagedkv.core.request import RequestLike

# The pool, the config and the façade import this module, so it names their types only
# in words (``Any`` below): a BlockPool, a CacheConfig, a KVCacheManager, a ComputedBlocks
# and per-group block tables.
BlockPool = Any
CacheConfig = Any
KVCacheManager = Any
ComputedBlocks = Any
BlockTables = Any

__all__ = [
    "AllocateCall",
    "ComponentSpec",
    "DeviceBlock",
    "EventPublisher",
    "EvictionPolicy",
    "ManagerBuild",
    "ManagerComponent",
    "PoolListener",
    "PublisherSpec",
]

#: A device block as a listener hears of it: (block id, hash, group).
DeviceBlock = tuple[int, bytes, int]


class PoolListener:
    """Told what the pool did; every method does nothing by default.

    Contract: a listener never changes the pool and never raises. The pool calls
    ``evicted`` only when at least one cached block was evicted, ``allocated`` and
    ``touched`` once per call with the block ids involved.
    """

    def evicted(self, blocks: list[DeviceBlock]) -> None:
        """``get_new_blocks`` evicted these cached blocks (eviction order), keys that a
        duplicate block still holds in the index left out."""

    def allocated(self, ids: list[int]) -> None:
        """``get_new_blocks`` handed out these blocks."""

    def touched(self, ids: Sequence[int]) -> None:
        """A prefix hit claimed these blocks (null blocks included, as given)."""

    def cleared(self) -> None:
        """The prefix index was reset."""


class EvictionPolicy:
    """The order free blocks are reused in, when it is not vLLM's LRU.

    The pool keeps its own code for everything and calls the policy at these points
    (:mod:`pagedkv.core.pool` shows where); each hook's default keeps the pool's
    behaviour, so a policy overrides only what it changes. ``bind`` is called once,
    when the pool exists; the policy may replace ``pool.free_queue`` then or later with a
    queue of the same interface.
    """

    def bind(self, pool: BlockPool) -> None:
        """The pool this policy orders (called once, at construction)."""

    def touch(self, ids: Sequence[int]) -> bool:
        """A hit on ``ids``; return True when the policy did the pool's ref counting
        itself (then the pool does not)."""
        return False

    def registered(
        self, request: RequestLike, blocks: Sequence[int], start: int, end: int, group: int,
        mask: Sequence[bool] | None,
    ) -> None:
        """``blocks[start:end]`` were registered (as far as ``mask`` allows)."""

    def registered_partial(self, request: RequestLike, block: int, key: bytes,
                           group: int) -> None:
        """``block`` was registered under the partial-prefix ``key``."""

    def before_evict_blocks(self) -> None:
        """``evict_blocks`` is about to drop blocks from the index."""

    def unhashed(self, block: int) -> None:
        """``block`` lost its hash (eviction)."""

    def moving(self, src: int, dst: int) -> Callable[[], None] | None:
        """``move_block_hashes(src, dst)`` is about to run; the returned callable (if any)
        runs after it."""
        return None

    def reset(self) -> bool | None:
        """``reset_prefix_cache`` is asked: False refuses it, True/None lets the pool go
        on (None: nothing to do before it)."""
        return None

    def settle(self) -> None:
        """Let time-based changes due by now happen (before the pool's state is read)."""

    def debug_state(self, state: dict[str, Any]) -> None:
        """Add the policy's state to the pool's ``debug_state``."""

    def check_invariants(self) -> None:
        """Assert the policy's state is consistent with the pool's."""


class EventPublisher(Protocol):
    """Where a manager's events go once per step (``KVCacheManager.publish_events``)."""

    def publish(self, events: Sequence[KVCacheEvent]) -> object: ...

    def close(self) -> None: ...


@runtime_checkable
class PublisherSpec(Protocol):
    """A config that builds the manager's event publisher (``CacheConfig.kv_events``)."""

    def make_publisher(
        self, snapshot_fn: Callable[[], list[BlockStored]]
    ) -> EventPublisher: ...


class ManagerComponent:
    """A feature attached to one façade; the façade calls these hooks (all optional).

    ``name`` is the façade attribute it is reachable as. Hooks a component does not
    override are not called at all: the façade collects, per hook, only the components
    whose class overrides it.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def bind(self, manager: KVCacheManager) -> None:
        """The façade now exists (called once, after construction)."""

    def after_lookup(self, request: RequestLike, hit: ComputedBlocks) -> None:
        """``get_computed_blocks`` found ``hit`` for ``request``."""

    def step_started(self) -> None:
        """``new_step_starts`` was called (a scheduler step begins)."""

    def before_allocate(self, request: RequestLike) -> None:
        """``allocate_slots`` is called for ``request`` (may raise a documented error;
        nothing has changed yet)."""

    def allocate_hit(self, request: RequestLike, call: AllocateCall) -> BlockTables | None:
        """``allocate_slots`` with a hit object this component issued (not a
        ``ComputedBlocks``; e.g. a host tier's tiered hit): do the allocation, usually by
        calling the façade's ``allocate_slots`` with the device part. Raise
        ``NotImplementedError`` for a hit of another kind."""
        raise NotImplementedError

    def after_allocate(self, request: RequestLike, hit: ComputedBlocks | None,
                       new: BlockTables | None) -> None:
        """``allocate_slots`` returned ``new`` (None: refused) for ``request`` with the
        device ``hit``."""

    def before_free(self, request: RequestLike | str, live: RequestLike | None) -> None:
        """``free`` is called (``live``: the tracked request, None if untracked; may
        raise a documented error while nothing has changed)."""

    def take_events(self) -> list[KVCacheEvent]:
        """Events of this component's own, appended after the device's."""
        return []

    def debug_state(self, state: dict[str, Any]) -> None:
        """Add this component's state to the façade's ``debug_state``."""

    def check_invariants(self) -> None:
        """Assert this component's state is consistent."""


#: The hooks the façade collects per component (see :class:`ManagerComponent`).
MANAGER_HOOKS = ("step_started", "after_lookup", "before_allocate", "allocate_hit",
                 "after_allocate", "before_free", "take_events", "debug_state",
                 "check_invariants")


@dataclass(frozen=True, slots=True)
class AllocateCall:
    """One ``allocate_slots`` call's arguments besides the request (see
    :meth:`pagedkv.KVCacheManager.allocate_slots` for each)."""

    num_new_tokens: int
    new_computed_blocks: object = None
    num_new_computed_tokens: int | None = None
    num_lookahead_tokens: int = 0
    num_external_computed_tokens: int = 0
    num_encoder_tokens: int = 0
    delay_caching: bool = False
    reserved_blocks: int = 0
    has_scheduled_reqs: bool = True
    full_sequence_must_fit: bool = False

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of this call (all but ``num_new_tokens``)."""
        return {f: getattr(self, f) for f in self.__slots__ if f != "num_new_tokens"}


def hook_users(components: Sequence[ManagerComponent], hook: str) -> tuple[Any, ...]:
    """The bound ``hook`` methods of the components whose class overrides it."""
    base = getattr(ManagerComponent, hook)
    return tuple(getattr(c, hook) for c in components if getattr(type(c), hook) is not base)


class Hooks:
    """Per hook of :class:`ManagerComponent`, the bound methods of the components that
    override it (an empty tuple when none does: the façade's loop over it costs nothing).

    >>> class Steps(ManagerComponent):
    ...     def step_started(self) -> None: ...
    >>> h = Hooks([Steps("a"), ManagerComponent("b")])
    >>> len(h.step_started), h.after_lookup
    (1, ())
    """

    step_started: tuple[Callable[[], None], ...]
    after_lookup: tuple[Callable[[RequestLike, ComputedBlocks], None], ...]
    before_allocate: tuple[Callable[[RequestLike], None], ...]
    allocate_hit: tuple[Callable[[RequestLike, AllocateCall], BlockTables | None], ...]
    after_allocate: tuple[Callable[[RequestLike, object, BlockTables | None], None], ...]
    before_free: tuple[Callable[[RequestLike | str, RequestLike | None], None], ...]
    take_events: tuple[Callable[[], list[KVCacheEvent]], ...]
    debug_state: tuple[Callable[[dict[str, Any]], None], ...]
    check_invariants: tuple[Callable[[], None], ...]

    def __init__(self, components: Sequence[ManagerComponent]) -> None:
        for hook in MANAGER_HOOKS:
            setattr(self, hook, hook_users(components, hook))


class ManagerBuild:
    """What a component spec sees while the façade is built (module docstring).

    ``recorder`` may be wrapped; ``listeners`` appended to; ``policy`` set once.
    """

    def __init__(self, config: CacheConfig, groups: list[GroupInfo], hash_block_size: int,
                 recorder: EventRecorder) -> None:
        self.config = config
        self.groups = groups
        self.hash_block_size = hash_block_size
        self.recorder = recorder
        self.listeners: list[PoolListener] = []
        self.policy: EvictionPolicy | None = None


@runtime_checkable
class ComponentSpec(Protocol):
    """A feature's config: ``attach`` is called once per façade built with it."""

    def attach(self, build: ManagerBuild) -> ManagerComponent: ...
