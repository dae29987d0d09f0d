"""Views of pagedkv's pool as vLLM's scheduler reads it: block objects, the
``KVCacheBlocks`` a lookup or allocation returns, the block pool, the coordinator and its
per-group managers. Every read goes through the façade's public calls
(:meth:`~pagedkv.KVCacheManager.block_info`, ``get_block_ids``, ``release_blocks``...);
nothing here writes pagedkv state except through them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pagedkv.vllm.compat import require_vllm

require_vllm()  # before vLLM's modules: one line when vLLM is missing or another release

from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id  # noqa: E402

from pagedkv.core.coordinator import ComputedBlocks  # noqa: E402
from pagedkv.core.group_hits import find_hit_per_group  # noqa: E402
from pagedkv.core.manager import KVCacheManager  # noqa: E402

__all__ = ["BlockPoolView", "BlockView", "CoordinatorView", "EmptyBlocks", "GroupView",
           "PagedKVBlocks", "coordinator_view"]


class BlockView:
    """One pool block as vLLM's ``KVCacheBlock`` reads: ``block_id``, ``ref_cnt``,
    ``block_hash`` (hash + group id, vLLM's key), ``is_null``. Read only; one object per
    block id (identity is stable, as vLLM's blocks are)."""

    __slots__ = ("_mgr", "block_id")

    def __init__(self, mgr: KVCacheManager, block_id: int) -> None:
        self._mgr = mgr
        self.block_id = block_id

    @property
    def ref_cnt(self) -> int:
        return self._mgr.block_info(self.block_id).ref_cnt

    @property
    def block_hash(self) -> bytes | None:
        info = self._mgr.block_info(self.block_id)
        if info.block_hash is None:
            return None
        return bytes(make_block_hash_with_group_id(info.block_hash, info.group))

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    def __repr__(self) -> str:
        return f"BlockView(block_id={self.block_id})"


@dataclass
class PagedKVBlocks(KVCacheBlocks):  # type: ignore[misc]
    """vLLM's ``KVCacheBlocks`` carrying the pagedkv hit it stands for (``hit``), so that
    ``allocate_slots`` adopts exactly what the lookup found."""

    hit: ComputedBlocks | None = None


@dataclass
class EmptyBlocks(PagedKVBlocks):
    """The manager's one empty ``KVCacheBlocks`` (most decode steps allocate nothing):
    ``get_block_ids`` answers it without vLLM's per-group loop, with vLLM's results
    (``None`` with ``allow_none``, else an empty list per group)."""

    def get_block_ids(self, allow_none: bool = False, *,
                      group_ids: Sequence[int] | None = None) -> tuple[list[int], ...] | None:
        if group_ids is None:
            return None if allow_none else tuple([] for _ in self.blocks)
        return super().get_block_ids(allow_none, group_ids=group_ids)  # type: ignore[no-any-return]


class BlockTable:
    """Block views by id, built once for the whole pool."""

    def __init__(self, mgr: KVCacheManager) -> None:
        self.views = [BlockView(mgr, b) for b in range(mgr.pool.num_blocks)]

    def of(self, ids: Sequence[int]) -> list[BlockView]:
        views = self.views
        return [views[b] for b in ids]

    def blocks(self, tables: Sequence[Sequence[int]], hit: ComputedBlocks | None = None
               ) -> PagedKVBlocks:
        return PagedKVBlocks(tuple(self.of(t) for t in tables), hit)


class BlockPoolView:
    """vLLM's ``BlockPool`` members the scheduler and tests read."""

    def __init__(self, mgr: KVCacheManager, table: BlockTable) -> None:
        self._mgr = mgr
        self._table = table
        self.num_gpu_blocks = mgr.pool.num_blocks
        self.hash_block_size = mgr.pool.hash_block_size
        self.blocks = table.views
        self.null_block = table.views[0]
        self.free_block_queue = self
        self.enable_caching = mgr.config.enable_caching

    @property
    def num_free_blocks(self) -> int:
        """(As ``free_block_queue.num_free_blocks``.)"""
        return self._mgr.num_free_blocks

    def get_num_free_blocks(self) -> int:
        return self._mgr.num_free_blocks

    def get_usage(self) -> float:
        return self._mgr.usage

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        """Drop one held reference to each block (blocks ``pop_blocks_for_free`` or a
        block copy handed out), the first evicted first."""
        self._mgr.release_blocks([b.block_id for b in ordered_blocks])

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self._mgr.evict_blocks(list(block_ids))

    def get_new_blocks(self, num_blocks: int) -> list[BlockView]:
        """Take ``num_blocks`` blocks from the front of the free queue, each with one
        reference held outside any block table (cached ones are evicted first), as vLLM's
        ``BlockPool.get_new_blocks``; give them back through :meth:`free_blocks`.

        Raises:
            ValueError: fewer free blocks than asked (vLLM's message); nothing taken.
        """
        if num_blocks > self._mgr.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        mgr = self._mgr
        ids = mgr.pool.get_new_blocks(num_blocks)
        mgr.held.hold(ids)  # what release_blocks (free_blocks) gives back
        return self._table.of(ids)

    def touch(self, blocks: Iterable[Any]) -> None:
        """One more reference to each non-null block (a free one leaves the free queue),
        held outside any block table, as vLLM's ``BlockPool.touch``; give it back through
        :meth:`free_blocks`."""
        ids = [b.block_id for b in blocks if b.block_id]
        self._mgr.pool.touch(ids)
        self._mgr.held.hold(ids)

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
                         ) -> list[BlockView] | None:
        found = self._mgr.get_cached_block(bytes(block_hash), list(kv_cache_group_ids))
        return None if found is None else self._table.of(found)


class _TablesView(Mapping[str, list[BlockView]]):
    """One group's block tables by request id (``req_to_blocks``), read only."""

    def __init__(self, mgr: KVCacheManager, table: BlockTable, group: int) -> None:
        self._mgr = mgr
        self._table = table
        self._group = group

    def __getitem__(self, request_id: str) -> list[BlockView]:
        if not self._mgr.has_request(request_id):
            raise KeyError(request_id)
        return self._table.of(self._mgr.get_block_ids(request_id)[self._group])

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._mgr.live_requests))

    def __len__(self) -> int:
        return len(self._mgr.live_requests)

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, str) and self._mgr.has_request(request_id)


class _CachedCountsView(Mapping[str, int]):
    """One group's registered-block counts by request id (``num_cached_block``)."""

    def __init__(self, mgr: KVCacheManager, group: int) -> None:
        self._mgr = mgr
        self._group = group

    def __getitem__(self, request_id: str) -> int:
        if not self._mgr.has_request(request_id):
            raise KeyError(request_id)
        return self._mgr.get_num_cached_blocks(request_id)[self._group]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._mgr.live_requests))

    def __len__(self) -> int:
        return len(self._mgr.live_requests)


class GroupView:
    """vLLM's per-group manager as read from outside: its spec, block size, group id,
    block tables, registered-block counts and the pool."""

    def __init__(self, mgr: KVCacheManager, table: BlockTable, group: int, spec: Any,
                 pool: BlockPoolView) -> None:
        self.block_pool = pool
        self.num_cached_block = _CachedCountsView(mgr, group)
        self.kv_cache_spec = spec
        self.block_size = int(spec.block_size)
        self.kv_cache_group_id = group
        self.req_to_blocks = _TablesView(mgr, table, group)
        self.retains_longer_hit = False
        #: Copies queued by code outside the manager, as (source, copy) block pairs, each
        #: block kept referenced by whoever queued it (vLLM's ``_pending_cow_copies``):
        #: drained by the manager's ``take_kv_cache_block_copies`` after pagedkv's own.
        self._pending_cow_copies: list[tuple[BlockView, BlockView]] = []
        #: vLLM's name for the shared null block (tests compare table entries to it).
        self._null_block = table.views[0]

    def take_pending_cow_copies(self) -> list[tuple[BlockView, BlockView]]:
        """Drain the copies queued on this group (``_pending_cow_copies``)."""
        pending, self._pending_cow_copies = self._pending_cow_copies, []
        return pending


_VLLM_MANAGERS = {
    "FullAttentionSpec": "FullAttentionManager",
    "MLAAttentionSpec": "FullAttentionManager",
    "SinkFullAttentionSpec": "SinkFullAttentionManager",
    "SlidingWindowSpec": "SlidingWindowManager",
    "ChunkedLocalAttentionSpec": "ChunkedLocalAttentionManager",
    "MambaSpec": "MambaManager",
    "CrossAttentionSpec": "CrossAttentionManager",
}
_view_classes: dict[str, type[GroupView]] = {}


def group_view_class(spec: Any) -> type[GroupView]:
    """A :class:`GroupView` class that is also an instance of vLLM's manager class for
    ``spec``'s kind (code that asks ``isinstance(m, CrossAttentionManager)`` gets the
    answer vLLM's own manager gives). vLLM's constructor never runs: every member read
    from outside is the view's."""
    name = _VLLM_MANAGERS.get(type(spec).__name__)
    if name is None:
        return GroupView
    cls = _view_classes.get(name)
    if cls is None:
        from vllm.v1.core import single_type_kv_cache_manager as stm

        base = getattr(stm, name)
        cls = type(f"PagedKV{name}View", (GroupView, base),
                   {"__abstractmethods__": frozenset(), "__module__": __name__})
        _view_classes[name] = cls
    return cls


class CoordinatorView:
    """vLLM's coordinator members read from outside the manager. Built through
    :func:`coordinator_view`, it is an instance of the vLLM coordinator class vLLM would
    build for the same layout (code asking ``isinstance(c, HybridKVCacheCoordinator)``
    gets vLLM's answer); vLLM's constructor never runs."""

    def __init__(self, mgr: KVCacheManager, table: BlockTable, specs: Sequence[Any],
                 pool: BlockPoolView) -> None:
        self._mgr = mgr
        self._table = table
        self.single_type_managers = [group_view_class(s)(mgr, table, g, s, pool)
                                    for g, s in enumerate(specs)]
        self.block_pool = pool
        self.enable_partial_hash_hits = False
        self.eagle_group_ids: tuple[int, ...] = ()
        self.num_reprefillable_tokens = mgr.coordinator.num_reprefillable_tokens
        #: The first full-attention group (vLLM's rule: its spec is a FullAttentionSpec,
        #: MLA and sinks included), the reference of per-group hits; None without one.
        self.full_attention_group_id = _first_full_attention(specs)

    def find_longest_cache_hit_per_group(self, block_hashes: list[bytes],
                                         max_cache_hit_length: int
                                         ) -> tuple[tuple[list[BlockView], ...], tuple[int, ...]]:
        """Each group's own longest hit (:func:`pagedkv.core.group_hits.find_hit_per_group`):
        blocks and lengths per group. No state change."""
        blocks, lengths = find_hit_per_group(self._mgr.coordinator, list(block_hashes),
                                             max(0, int(max_cache_hit_length)))
        return tuple(self._table.of(b) for b in blocks), lengths

    def get_num_blocks_to_allocate(self, *, request_id: str, num_tokens: int,
                                   total_computed_tokens: int, num_encoder_tokens: int = 0,
                                   **_ignored: Any) -> int:
        """Blocks the request still needs to hold ``num_tokens`` tokens, admission caps
        applied (what vLLM's scheduler asks before promoting an async load)."""
        return int(self._mgr.coordinator.num_blocks_for_full_sequence(
            request_id, None, total_computed_tokens, num_tokens, num_encoder_tokens))


def _first_full_attention(specs: Sequence[Any]) -> int | None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    for g, spec in enumerate(specs):
        if isinstance(spec, FullAttentionSpec) and getattr(spec, "prefix_cacheable", True):
            return g
    return None


_coordinator_classes: dict[str, type[CoordinatorView]] = {}


def coordinator_view(mgr: KVCacheManager, table: BlockTable, specs: Sequence[Any],
                     pool: BlockPoolView) -> CoordinatorView:
    """A :class:`CoordinatorView` that is also an instance of the vLLM coordinator class
    for this layout (no caching, one group, or hybrid, as ``get_kv_cache_coordinator``
    picks)."""
    if not mgr.config.enable_caching:
        name = "KVCacheCoordinatorNoPrefixCache"
    else:
        name = "UnitaryKVCacheCoordinator" if len(specs) == 1 else "HybridKVCacheCoordinator"
    cls = _coordinator_classes.get(name)
    if cls is None:
        from vllm.v1.core import kv_cache_coordinator as kc

        cls = type(f"PagedKV{name}View", (CoordinatorView, getattr(kc, name)),
                   {"__abstractmethods__": frozenset(), "__module__": __name__})
        _coordinator_classes[name] = cls
    return cls(mgr, table, specs, pool)
