"""The coordinators without a hybrid lookup (see :mod:`pagedkv.core.coordinator`).

* :class:`NoPrefixCacheCoordinator` — caching off: no lookup, nothing registered.
* :class:`UnitaryCoordinator` — one group: that group's longest hit; no loops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from pagedkv.core.coordinator_base import BlockTables, Coordinator
from pagedkv.core.external_blocks import allocate_external, uncounted_blocks
from pagedkv.core.kernels import kernels
from pagedkv.core.lookup_plan import KernelLookup, hit_plan
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.pool import BlockPool
from pagedkv.core.request import RequestLike

__all__ = ["NoPrefixCacheCoordinator", "UnitaryCoordinator"]


class NoPrefixCacheCoordinator(Coordinator):
    """Caching off: no lookup, no hit adopted, nothing registered."""

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[BlockTables, int] | None:
        return None

    def lookup_request(self, mgr: Any, request: RequestLike, num_tokens: int) -> Any:
        """The façade's lookup after its checks: none, nothing counted (caching off). As
        :func:`~pagedkv.core.kernels_hybrid_hits.lookup_request` over this class's
        lookup. O(1)."""
        return mgr._empty_hit

    def hit_problem(
        self, block_hashes: list[bytes], hit: BlockTables, num_hit_tokens: int
    ) -> str | None:
        if num_hit_tokens or type(hit) is not tuple or any(hit):
            return "prefix caching is off: this manager hands out no hits"
        return None

    def allocate(
        self,
        request_id: str,
        hit: BlockTables | None,
        num_computed_tokens: int,
        total_computed_tokens: int,
        num_tokens: int,
        num_encoder_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        headroom_blocks: int = 0,
        num_local_computed_tokens: int | None = None,
    ) -> BlockTables | None:
        return super().allocate(
            request_id, None, num_computed_tokens=num_computed_tokens,
            total_computed_tokens=total_computed_tokens, num_tokens=num_tokens,
            num_encoder_tokens=num_encoder_tokens, num_tokens_main_model=num_tokens_main_model,
            headroom_blocks=headroom_blocks, num_local_computed_tokens=num_local_computed_tokens)

    def cache_blocks(self, request: RequestLike, num_tokens: int) -> None:
        return


class UnitaryCoordinator(KernelLookup, Coordinator):
    """One group: its own longest hit, and the allocation without per-group loops."""

    def __init__(self, managers: Sequence[SingleTypeManager], pool: BlockPool) -> None:
        super().__init__(managers, pool)
        assert len(self.managers) == 1
        self._manager = self.managers[0]
        self._kernels = kernels()
        self._install_hit()

    def _install_hit(self) -> None:
        """Put the lookup kernel (kernels_hybrid_hits) in front of
        :meth:`find_longest_cache_hit` for a sliding-window, chunked-local or Mamba align
        group that looks up by its class's rule (full attention keeps its own method: the
        compiled core's ``DecodeAllocate`` takes its lookups), and the façade's
        ``lookup_request`` over that kernel (no reference back to this coordinator)."""
        if (type(self).find_longest_cache_hit is UnitaryCoordinator.find_longest_cache_hit
                and self._manager.hit_shape != "prefix"):
            self._use_hit_kernel(hit_plan(self.managers, (), (0,), 1, True))

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int
    ) -> tuple[BlockTables, int] | None:
        m = self._manager
        blocks = m.find_longest_cache_hit(block_hashes, max_length)
        return (blocks,), len(blocks) * m.block_size

    def allocate(
        self,
        request_id: str,
        hit: BlockTables | None,
        num_computed_tokens: int,
        total_computed_tokens: int,
        num_tokens: int,
        num_encoder_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        headroom_blocks: int = 0,
        num_local_computed_tokens: int | None = None,
    ) -> BlockTables | None:
        """As :meth:`Coordinator.allocate`, for the one group."""
        m = self._manager
        if hit is None and m.grows_plainly:
            table = m.req_to_blocks.get(request_id)
            if table is not None:
                # NOTE: inlined for speed, as Coordinator._grow: a running request.
                if m.drops_blocks:
                    m.remove_skipped_blocks(request_id, num_computed_tokens)
                n = -(-num_tokens // m.block_size) - len(table)
                pool = self.pool
                if (n if n > 0 else 0) + headroom_blocks > pool.free_queue.num_free:
                    return None
                if n <= 0:
                    return ([],)
                new = pool.get_new_blocks(n)
                table.extend(new)
                if self.zeroing[0]:
                    self.new_block_ids[0].extend(b for b in new if b)
                return (new,)
        # NOTE: a new request takes the general branch below, not the admission kernel
        # (admit_groups) the base uses: for one group the kernel's per-group plan costs
        # the pure core 10-20 % of a first allocation, and the compiled cores take first
        # calls before they get here (ccore_admit.h, ccore_hybrid_first.h).
        if m.ignores_lookahead and num_tokens_main_model is not None:
            slots = num_tokens_main_model
        else:
            slots = m.slots_needed(num_tokens, num_encoder_tokens)
        table_hit = hit[0] if hit is not None else []
        if m.drops_blocks:
            m.remove_skipped_blocks(request_id, num_computed_tokens)
        loads = num_local_computed_tokens is not None and (
            total_computed_tokens > num_local_computed_tokens)
        extra = uncounted_blocks(self.managers, (slots,), total_computed_tokens) if loads else 0
        if m.get_num_blocks_to_allocate(
            request_id, slots, table_hit, total_computed_tokens
        ) + max(headroom_blocks, extra) > self.pool.free_queue.num_free:
            return None
        if hit is not None:
            self.pool.touch(m.claimed_hit_blocks(table_hit, total_computed_tokens))
        m.save_new_computed_blocks(request_id, table_hit, total_computed_tokens)
        if loads:
            allocate_external(self.managers, request_id, cast(int, num_local_computed_tokens),
                              total_computed_tokens, self.zeroing, self.new_block_ids,
                              self.skip_zeroing_group_ids)
        new = m.allocate_new_blocks(request_id, slots)
        if self.zeroing[0] and new:
            self.new_block_ids[0].extend(b for b in new if b)
        return (new,)
