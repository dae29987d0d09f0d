"""The rest of vLLM 0.33's manager surface, as methods of :class:`pagedkv.KVCacheManager`.

* **Deferred frees.** :meth:`~ManagerSurface.pop_blocks_for_free` forgets a request but
  keeps its blocks referenced (an in-flight step may still write them);
  :meth:`~ManagerSurface.release_blocks` drops those references later. vLLM's scheduler
  does this when a finished request's blocks may still be written by a step in flight.
* **Truncated hits.** :meth:`~ManagerSurface.truncate_computed_blocks` cuts a lookup
  result at a shorter block-aligned length (pure slicing; nothing is claimed).
* **Block copies.** A sub-block prefix hit (hash block smaller than a group's block,
  see :mod:`pagedkv.core.partial_hits`) ends inside a block the request must not write:
  its allocation takes a fresh block and queues a copy;
  :meth:`~ManagerSurface.take_block_copies` hands the copies to the engine once per step
  (vLLM's ``take_kv_cache_block_copies``).
* **Blocks to zero.** With ``CacheConfig.zero_new_blocks`` (on by default for models with
  a Mamba group, as vLLM's ``needs_kv_cache_zeroing``) every attention block an allocation
  takes is recorded; :meth:`~ManagerSurface.take_new_block_ids` hands them to the engine
  once per step, :meth:`~ManagerSurface.record_blocks_for_zeroing` records a request's
  blocks again (e.g. after a failed KV load left them unwritten).

Worked case (full attention, block 4, 10 usable blocks): a request holding ``[1, 2, 3]``
is popped: ``pop_blocks_for_free`` returns ``[1, 2, 3]``, the free count stays 7, the
request is gone (``has_request`` is false); ``release_blocks([3, 2, 1])`` frees them, tail
first, and the free count is 10 again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pagedkv.core import validation
from pagedkv.core.coordinator import ComputedBlocks, Coordinator, PartialHitCoordinator
from pagedkv.core.request import RequestLike
from pagedkv.errors import InvalidArgumentError, InvalidHitError

if TYPE_CHECKING:
    from collections.abc import Callable

    from pagedkv.core.managers import SingleTypeManager
    from pagedkv.core.pool import BlockPool

__all__ = ["BlockCopies", "BlockCopy", "ManagerSurface"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCopy:
    """Copy block ``src_block_id`` into ``dst_block_id`` (whole block) before the step runs."""

    src_block_id: int
    dst_block_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCopies:
    """The copies of one step and the blocks they keep referenced: release ``retained``
    with :meth:`ManagerSurface.release_blocks` once the copies ran."""

    copies: tuple[BlockCopy, ...] = ()
    retained: tuple[int, ...] = ()


_NO_COPIES = BlockCopies()


class ManagerSurface:
    """Mixed into :class:`pagedkv.KVCacheManager` (module docstring). Every method leaves
    state unchanged when it raises."""

    coordinator: Coordinator
    pool: BlockPool
    managers: list[SingleTypeManager]
    live_requests: dict[str, RequestLike]
    _before_free: tuple[Callable[[RequestLike | str, RequestLike | None], None], ...]
    issuer_token: object
    #: Block id -> references held outside block tables (popped by
    #: :meth:`pop_blocks_for_free`, not released yet). Read-only for callers.
    held_outside: dict[int, int]

    def require_live(self, request_id: str) -> None:
        raise NotImplementedError

    # ---------------------------------------------------------------- deferred frees

    def pop_blocks_for_free(self, request: RequestLike | str) -> list[int]:
        """Forget the request (its id is free again) but keep its blocks referenced: its
        tables in group order, each without leading null blocks, as vLLM 0.33's method of
        this name. Release them with :meth:`release_blocks` **last first**
        (``reversed(...)``) once nothing writes them any more, so the tail is evicted
        first, exactly as :meth:`pagedkv.KVCacheManager.free` would have queued them.
        ``[]`` for a request the manager does not track.

        Raises:
            InvalidArgumentError: neither a request nor a str.
            DuplicateRequestError: a request object whose id another live request holds.
        """
        rid = validation.check_free(cast("validation.ManagerView", self), request)
        live = self.live_requests.get(rid)
        if live is None:
            return []
        for before in self._before_free:
            before(request, live)
        del self.live_requests[rid]
        blocks = self.coordinator.pop_blocks_for_free(rid)
        held = self.held_outside
        for b in blocks:
            if b:
                held[b] = held.get(b, 0) + 1
        return blocks

    def release_blocks(self, block_ids: Sequence[int]) -> None:
        """Drop one reference to each of ``block_ids``, in the order given (the first is
        evicted first once free): blocks returned by :meth:`pop_blocks_for_free` (pass them
        reversed) or retained for a copy (:meth:`take_block_copies`). Null blocks (0) are
        skipped.

        Raises:
            InvalidArgumentError: not a sequence of ints, or an id the engine holds no (or
                not that many) references to outside block tables; nothing is released.
        """
        if type(block_ids) is not list and (
                isinstance(block_ids, (str, bytes)) or not isinstance(block_ids, Sequence)):
            raise InvalidArgumentError(
                f"release_blocks takes a list of block ids, got {type(block_ids).__name__}"
            )
        held = self.held_outside
        # Common case in one pass: every id an int held outside the tables; undone and
        # explained below if one is not.
        taken: list[int] = []
        for b in block_ids:
            if type(b) is not int or b not in held:
                if type(b) is int and b == 0:
                    continue
                break
            n = held[b]
            if n == 1:
                del held[b]
            else:
                held[b] = n - 1
            taken.append(b)
        else:
            self.pool.free_blocks(block_ids)
            return
        for b in taken:
            held[b] = held.get(b, 0) + 1
        want = Counter(b for b in block_ids if not (type(b) is int and b == 0))
        for b, n in want.items():
            if type(b) is not int or held.get(b, 0) < n:
                raise InvalidArgumentError(
                    f"release_blocks: block {b!r} is released {n} time(s) but held "
                    f"{held.get(b, 0) if type(b) is int else 0} time(s) outside block "
                    "tables; release only blocks pop_blocks_for_free returned, once each"
                )
        for b, n in want.items():
            left = held[b] - n
            if left:
                held[b] = left
            else:
                del held[b]
        self.pool.free_blocks(block_ids)

    def take_block_copies(self) -> BlockCopies:
        """The block copies queued since the last call (copy on write of a sub-block hit),
        in group order, and the blocks they keep referenced (source and copy of each, in
        that order): run the copies, then pass ``retained`` to :meth:`release_blocks`. As
        vLLM 0.33's ``take_kv_cache_block_copies``; empty unless sub-block hits are on.

        Worked case (full attention 16 + Mamba 16, hash block 4): a new request adopting a
        hit of 24 tokens whose full-attention block 1 is ``b`` and whose Mamba state is
        ``s`` gets copies ``b -> c1`` and ``s -> c2``, retained ``(b, c1, s, c2)``.
        """
        coord = self.coordinator
        if not isinstance(coord, PartialHitCoordinator):
            return _NO_COPIES
        pairs = coord.take_copies()
        if not pairs:
            return _NO_COPIES
        held = self.held_outside
        retained: list[int] = []
        for src, dst in pairs:
            retained.append(src)
            retained.append(dst)
            held[src] = held.get(src, 0) + 1
            held[dst] = held.get(dst, 0) + 1
        return BlockCopies(
            copies=tuple(BlockCopy(src_block_id=a, dst_block_id=b) for a, b in pairs),
            retained=tuple(retained),
        )

    # ---------------------------------------------------------------- truncated hits

    def truncate_computed_blocks(
        self, hit: ComputedBlocks, num_computed_tokens: int
    ) -> ComputedBlocks:
        """``hit`` cut at ``num_computed_tokens`` (vLLM 0.33's method of this name): each
        group keeps its first ``num_computed_tokens // block_size`` blocks (a Mamba group at
        most the blocks it has). Pure slicing: nothing is claimed, ``hit`` is unchanged.
        The result is checked like any hit when adopted: a group left without the blocks
        its next token reads (a window or a Mamba state) makes ``allocate_slots`` raise
        :class:`~pagedkv.errors.InvalidHitError` (vLLM leaves that to the caller).

        Worked case (full attention, block 4): a 12-token hit ``[5, 6, 7]`` cut at 8 ->
        ``[5, 6]``, 8 tokens.

        Raises:
            InvalidHitError: ``hit`` was not issued by this manager.
            InvalidArgumentError: ``num_computed_tokens`` is not an int in
                ``[0, hit tokens]`` or not a multiple of every caching group's block size.
        """
        if not isinstance(hit, ComputedBlocks) or hit.issuer is not self.issuer_token:
            raise InvalidHitError(
                "truncate_computed_blocks takes a hit get_computed_blocks returned on this "
                f"manager, got {type(hit).__name__}"
            )
        n = validation.check_count("num_computed_tokens", num_computed_tokens)
        if n > hit.num_computed_tokens:
            raise InvalidArgumentError(
                f"cannot truncate a {hit.num_computed_tokens}-token hit to {n} tokens; "
                "truncation only shortens a hit"
            )
        out: list[list[int]] = []
        for m, blocks in zip(self.managers, hit.block_ids, strict=True):
            if not m.cacheable:
                out.append([])
                continue
            if n % m.block_size:
                raise InvalidArgumentError(
                    f"cannot truncate a hit to {n} tokens: not a multiple of group "
                    f"{m.group}'s block size {m.block_size}"
                )
            out.append(list(blocks[: n // m.block_size]))
        return ComputedBlocks(tuple(out), n, self.issuer_token, hit.request_id)

    # ---------------------------------------------------------------- blocks to zero

    def take_new_block_ids(self) -> list[int]:
        """The attention blocks allocated since the last call, group by group, for the
        engine to zero before use (empty unless ``CacheConfig.zero_new_blocks``; on by
        default with a Mamba group, as vLLM's ``needs_kv_cache_zeroing``). Call once per
        step, like :meth:`pagedkv.KVCacheManager.take_events`."""
        pending = self.coordinator.new_block_ids
        out: list[int] = []
        for ids in pending:
            out.extend(ids)
            ids.clear()
        return out

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Record the request's blocks from token ``start_token`` on again, in every group
        whose blocks are zeroed (e.g. blocks a failed KV load left unwritten); the next
        :meth:`take_new_block_ids` returns them (null blocks as 0), as vLLM 0.33.

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
            InvalidArgumentError: ``start_token`` is not an int >= 0 or not a multiple of
                the block size of every zeroed group (zeroing half a block would wipe its
                valid start).
        """
        self.require_live(request_id)
        start = validation.check_count("start_token", start_token)
        coord = self.coordinator
        groups = [m for m in self.managers if coord.zeroing[m.group]]
        for m in groups:
            if start % m.block_size:
                raise InvalidArgumentError(
                    f"start_token={start} is not a multiple of group {m.group}'s block size "
                    f"{m.block_size}; zero from a block boundary"
                )
        for m in groups:
            coord.new_block_ids[m.group].extend(
                m.req_to_blocks[request_id][start // m.block_size :])
