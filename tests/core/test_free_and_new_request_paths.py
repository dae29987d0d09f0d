"""The cheap checks on two hot calls keep their answers.

* ``GroupsAllocate.free`` (``ccore_groups_free_queue.h``) finds the pool's compiled free
  queue without building the pool's bound ``free_blocks``: a ``free_blocks`` or a free
  kernel replaced on the pool (instance or class) is still the one a free runs, and the
  state after every free equals the pure core's.
* ``HashExtras`` that set nothing are one shared instance (copies and pickles keep
  equality, subclasses get their own instances), and ``KVCacheManager.new_request``'s
  direct path raises what its checks raise.
"""

from __future__ import annotations

import copy
import pickle
import random
from collections.abc import Callable
from typing import Any

import pytest
from test_compiled_groups import LAYOUTS, manager_pair

from pagedkv import KVCacheManager
from pagedkv.core import native
from pagedkv.core.hash_extras import HashExtras, LoRA, MultiModalItem
from pagedkv.core.pool import BlockPool
from pagedkv.errors import DuplicateRequestError, InvalidArgumentError

compiled_only = pytest.mark.skipif(native.active() is None,
                                   reason=f"no compiled core: {native.IMPORT_ERROR}")


def _drive(mgr: KVCacheManager, seed: int) -> list[Any]:
    """Random admissions and frees; the free queue after each free."""
    rng = random.Random(seed)
    live: dict[str, Any] = {}
    seen: list[Any] = []
    for step in range(60):
        if live and rng.random() < 0.4:
            rid = rng.choice(sorted(live))
            mgr.free(live.pop(rid) if rng.random() < 0.5 else (live.pop(rid), rid)[1])
            state = mgr.pool.debug_state()
            seen.append((state["free_queue"], state["block_hash"], mgr.num_free_blocks))
            continue
        rid = f"r{step}"
        req = mgr.new_request(rid, [rng.randrange(4) for _ in range(rng.randrange(1, 12))])
        hit = mgr.get_computed_blocks(req)
        if mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                              new_computed_blocks=hit) is not None:
            live[rid] = req
    return seen


@compiled_only
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", range(3))
def test_free_matches_pure(layout: str, seed: int) -> None:
    compiled, pure = manager_pair(layout)
    assert _drive(compiled, seed) == _drive(pure, seed)
    compiled.check_invariants()


def _spy(calls: list[str], name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    def spy(*args: Any) -> Any:
        calls.append(name)
        return f(*args)
    return spy


@compiled_only
@pytest.mark.parametrize("layout", ["swa", "chunked", "full+mamba"])
def test_free_runs_what_the_pool_holds(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for where in ("instance", "class", "kernel"):
        mgr, pure = manager_pair(layout)
        calls: list[str] = []
        pool = mgr.pool
        if where == "instance":
            pool.free_blocks = _spy(calls, where, pool.free_blocks)  # type: ignore[method-assign]
        elif where == "class":
            monkeypatch.setattr(BlockPool, "free_blocks",
                                _spy(calls, where, BlockPool.free_blocks))
        else:
            pool._pool_free = _spy(calls, where, pool._pool_free)
        assert _drive(mgr, 7) == _drive(pure, 7)
        assert calls and set(calls) == {where}
        monkeypatch.undo()


def test_empty_extras_are_shared_and_round_trip() -> None:
    empty = HashExtras()
    assert HashExtras(lora=None, mm_items=(), cache_salt=None) is empty
    assert empty.is_empty and HashExtras(mm_items=[]) == empty
    full = HashExtras(lora=LoRA("a", 1, "p"), mm_items=[MultiModalItem("i", 0, 2)],
                      cache_salt="s")
    for extras in (empty, full, HashExtras(cache_salt="")):
        assert pickle.loads(pickle.dumps(extras)) == extras
        assert copy.copy(extras) == extras == copy.deepcopy(extras)

    class Mine(HashExtras):
        __slots__ = ()

    assert type(Mine()) is Mine and Mine() is not Mine()
    with pytest.raises(InvalidArgumentError, match="cache_salt"):
        HashExtras(cache_salt=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("layout", ["swa", "full+mamba"])
def test_new_request_direct_path_raises_as_the_checks(layout: str) -> None:
    for mgr in manager_pair(layout):
        mgr.new_request("a", [1, 2, 3])
        assert mgr.allocate_slots(mgr.new_request("b", [1, 2]), 2) is not None
        with pytest.raises(DuplicateRequestError):
            mgr.new_request("b", [1])
        with pytest.raises(InvalidArgumentError, match="max_model_len"):
            mgr.new_request("c", [1] * (mgr.max_model_len + 1))
        with pytest.raises(InvalidArgumentError, match="empty prompt"):
            mgr.new_request("c", [])
        with pytest.raises(InvalidArgumentError):
            mgr.new_request("", [1])
        with pytest.raises(InvalidArgumentError, match="hash_extras"):
            mgr.new_request("c", [1], hash_extras="salt")  # type: ignore[arg-type]
        req = mgr.new_request("c", (1, 2, 3, 4, 5), hash_extras=HashExtras())
        assert req.hash_extras is None and req.all_token_ids == [1, 2, 3, 4, 5]
