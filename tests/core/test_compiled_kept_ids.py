"""The compiled take's kept block-id ints, its free without packed arguments and the
index loop's block-id reading (``_csrc/ccore_pool.h``, ``ccore_refs.h``, ``ccore_lookup.h``,
``ccore_index.h``), each against the pure core.

(1) A compiled take hands out one int object per block, made the first time the block
leaves the queue and kept by the queue (as vLLM's blocks keep their ``block_id``):
equal values to the pure core's, the same objects from take to take. (2) Requests of more
blocks than the C stack buffers hold (256 ids) take, register and free what the pure core
does. (3) A free whose table holds an id outside the pool raises before the pool changed.
(4) The index loop reads exact ints, bools and bad ids as the pure kernel does.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from compiled_support import manager, needs_compiled

from pagedkv import KVCacheManager, Request
from pagedkv.core.kernels import COMPILED, PURE

pytestmark = needs_compiled


def pool_state(mgr: KVCacheManager) -> tuple[Any, ...]:
    """What a take, registration or free changes, the block ids as plain values."""
    pool = mgr.pool
    return (mgr.debug_state(), mgr.num_free_blocks, pool.num_evicted_blocks,
            list(pool.ref_cnt), sorted(mgr.live_requests))


def admit(mgr: KVCacheManager, rid: str, prompt: list[int]) -> tuple[Request, Any]:
    req = Request(rid, prompt, hasher=mgr.hasher)
    hit = mgr.get_computed_blocks(req)
    out = mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                             new_computed_blocks=hit)
    return req, out


def test_a_block_keeps_one_int_object_from_take_to_take() -> None:
    """The same block taken twice comes back as the same int object; the values equal
    the pure core's take for take."""
    compiled, pure = manager(num_blocks=9), manager(pure=True, num_blocks=9)
    seen: dict[int, int] = {}
    for i in range(6):
        prompt = list(range(100 * i, 100 * i + 32))  # 8 blocks: the whole pool
        (a, got), (b, want) = admit(compiled, f"r{i}", prompt), admit(pure, f"r{i}", prompt)
        assert got is not None and got == want
        for block in got[0]:
            assert seen.setdefault(block, id(block)) == id(block)
        compiled.free(a)
        pure.free(b)
        assert pool_state(compiled) == pool_state(pure)
    assert len(seen) == 8


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))])
def test_a_copied_queue_takes_the_same_ids(clone: Any) -> None:
    """A copied or unpickled manager's queue starts without kept ints and takes what the
    original takes."""
    mgr = manager(num_blocks=12)
    req, _ = admit(mgr, "a", list(range(20)))
    mgr.free(req)
    other = clone(mgr)
    for m in (mgr, other):
        _, out = admit(m, "b", list(range(500, 540)))
        assert out is not None
    assert pool_state(mgr) == pool_state(other)


def test_requests_beyond_the_stack_buffers_equal_the_pure_core() -> None:
    """Prompts of 300-340 blocks (past the 256-id buffers of the take and the free, and
    the 512 of the free's two runs) admitted, freed and evicted as in the pure core."""
    fields: dict[str, Any] = {"num_blocks": 700, "max_model_len": 1400}
    compiled, pure = manager(**fields), manager(pure=True, **fields)
    for i in range(5):
        prompt = list(range(10_000 * i, 10_000 * i + 1200 + 40 * i))
        if i == 4:
            prompt = list(range(1200))  # the first prompt again: a hit
        (a, got), (b, want) = admit(compiled, f"r{i}", prompt), admit(pure, f"r{i}", prompt)
        assert got == want and got is not None
        assert pool_state(compiled) == pool_state(pure)
        compiled.free(a)
        pure.free(b)
        assert pool_state(compiled) == pool_state(pure)
        compiled.check_invariants()
    assert compiled.pool.num_evicted_blocks == pure.pool.num_evicted_blocks > 0


def test_a_table_with_an_id_outside_the_pool_raises_before_the_pool_changed() -> None:
    mgr = manager()
    req, out = admit(mgr, "r", list(range(16)))
    assert out is not None
    table = mgr.coordinator.managers[0].req_to_blocks["r"]
    table.append(10_000)
    before = (mgr.num_free_blocks, list(mgr.pool.ref_cnt), mgr.pool.free_queue.to_list())
    with pytest.raises(IndexError, match="outside the pool"):
        mgr.free(req)
    assert (mgr.num_free_blocks, list(mgr.pool.ref_cnt), mgr.pool.free_queue.to_list()) \
        == before


class Log:
    """index_register's evict callback, recording the blocks it is handed."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, b: Any) -> None:
        self.calls.append(b)


def register(kernels: Any, blocks: list[Any]) -> tuple[Any, ...]:
    """index_register over `blocks` on a fresh 5-block state: (its answer or its
    exception's type, the state after)."""
    bh: list[Any] = [None] * 5
    bg: list[int] = [0] * 5
    index: dict[bytes, Any] = {}
    dups: dict[bytes, list[Any]] = {}
    log = Log()
    hashes = [bytes([i]) * 4 for i in range(len(blocks))]
    try:
        out: Any = kernels.index_register(list(blocks), hashes, 0, len(blocks), index, dups,
                                          bh, bg, 0, log)
    except Exception as exc:  # the type is what is compared
        out = type(exc)
    return out, bh, bg, index, dups, log.calls


@pytest.mark.parametrize("blocks", [[0, 1, 2], [True, 2], [False, 3], [1, 9], [4, 0, 3]])
def test_the_index_loop_reads_block_ids_as_the_pure_kernel(blocks: list[Any]) -> None:
    """Null blocks (0, False) skipped, True read as block 1, an id past the pool raising
    IndexError after the ones before it joined, as in the pure kernel."""
    assert COMPILED is not None
    assert register(PURE, blocks) == register(COMPILED, blocks)


@pytest.mark.parametrize(("bad", "error"), [(-1, IndexError), (2 ** 70, OverflowError),
                                            ("2", IndexError), (2.0, IndexError)])
def test_the_index_loop_refuses_ids_outside_its_contract(bad: Any, error: type) -> None:
    """Ids no pool hands out (negative, huge, not an int) raise in the compiled loop (the
    pure kernel's list indexing would accept a negative one: outside the contract)."""
    assert COMPILED is not None
    assert register(COMPILED, [1, bad])[0] is error
