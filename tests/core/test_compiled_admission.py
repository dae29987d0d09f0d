"""The compiled core's first ``allocate_slots`` of a request (``_csrc/ccore_admit.h``).

``DecodeAllocate`` takes a request's first call — ``allocate_slots(req, n)`` or
``allocate_slots(req, n, new_computed_blocks=hit)`` with a fresh hit — on one
full-attention group. These tests show (1) that it takes exactly those calls (a spy on
the Python method sees none of them) and returns, changes and counts what the pure core
does, and (2) that every other first call reaches the Python method before anything
changed, so the errors and the general path are the Python method's.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from compiled_support import manager, needs_compiled

from pagedkv import KVCacheManager, Request
from pagedkv.core import facade_allocation, fast_paths
from pagedkv.errors import DuplicateRequestError, InvalidArgumentError, InvalidHitError

pytestmark = needs_compiled


class Spy:
    """The Python allocate_slots, counting the calls DecodeAllocate hands to it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, mgr: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return facade_allocation.allocate_slots(mgr, *args, **kwargs)


def spied(**fields: Any) -> tuple[KVCacheManager, Spy]:
    """A compiled manager whose allocate_slots reports its fallbacks to a spy."""
    mgr, spy = manager(**fields), Spy()
    fast = fast_paths.install(mgr, spy, facade_allocation.cache_blocks)
    assert fast is not None
    mgr.allocate_slots = fast  # type: ignore[method-assign]
    return mgr, spy


def admit(mgr: KVCacheManager, rid: str, prompt: list[int]) -> tuple[Request, Any]:
    """Look ``prompt`` up and allocate it whole with its hit; (request, answer)."""
    req = Request(rid, prompt, hasher=mgr.hasher)
    hit = mgr.get_computed_blocks(req)
    out = mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                             new_computed_blocks=hit)
    if out is not None:
        req.num_computed_tokens = req.num_tokens
    return req, out


def snapshot(mgr: KVCacheManager) -> tuple[Any, ...]:
    """Everything a first allocation may change."""
    return (mgr.debug_state(), sorted(mgr.live_requests), mgr.num_free_blocks,
            mgr.pool.num_evicted_blocks)


PROMPTS = [list(range(10)), list(range(10)) + [99, 98], list(range(13)),
           list(range(100, 117)), list(range(200, 230)), list(range(10)) + [7] * 9,
           list(range(300, 364))]


def test_first_calls_are_compiled_and_equal_to_the_pure_core() -> None:
    """Hits, partial hits, no hits, evictions and a refusal: the compiled admission
    answers and changes what the pure core does, without calling the Python method."""
    compiled, spy = spied()
    pure = manager(pure=True)
    held: list[tuple[Request, Request]] = []
    for i, prompt in enumerate(PROMPTS * 2):
        pair = [admit(m, f"r{i}", prompt) for m in (compiled, pure)]
        assert pair[0][1] == pair[1][1], prompt
        assert snapshot(compiled) == snapshot(pure)
        assert compiled.make_prefix_cache_stats() == pure.make_prefix_cache_stats()
        if pair[0][1] is not None:
            held.append((pair[0][0], pair[1][0]))
        while len(held) > 2:  # free the oldest: their blocks stay cached, then evict
            a, b = held.pop(0)
            compiled.free(a)
            pure.free(b)
        compiled.check_invariants()
    assert spy.calls == 0


def test_a_refusal_changes_nothing() -> None:
    mgr, spy = spied(num_blocks=6)
    req = Request("big", list(range(40)), hasher=mgr.hasher)
    hit = mgr.get_computed_blocks(req)
    before = snapshot(mgr)
    assert mgr.allocate_slots(req, 40, new_computed_blocks=hit) is None
    assert snapshot(mgr) == before and spy.calls == 0


def test_the_watermark_applies_to_first_calls() -> None:
    """has_scheduled_reqs defaults to True: a first call leaves the watermark free."""
    for pure in (False, True):
        mgr = manager(pure=pure, num_blocks=10, watermark=0.3)  # 3 blocks kept
        req = Request("w", list(range(28)), hasher=mgr.hasher)  # 7 blocks + 3 > 9 free
        assert mgr.allocate_slots(req, 28) is None
        req = Request("v", list(range(24)), hasher=mgr.hasher)  # 6 blocks + 3 = 9
        assert mgr.allocate_slots(req, 24) == ([1, 2, 3, 4, 5, 6],)


def test_a_stale_hit_goes_to_the_python_method() -> None:
    """The index changed since the lookup: the Python method rechecks the hit."""
    mgr, spy = spied()
    first, _ = admit(mgr, "a", list(range(12)))
    mgr.free(first)
    req = Request("b", list(range(12)) + [5], hasher=mgr.hasher)
    hit = mgr.get_computed_blocks(req)
    assert hit.num_computed_tokens == 12
    mgr.reset_prefix_cache()  # every block's hash is dropped
    with pytest.raises(InvalidHitError):
        mgr.allocate_slots(req, 1, new_computed_blocks=hit)
    assert spy.calls == 1 and "b" not in mgr.live_requests


@pytest.mark.parametrize("case", [
    "other manager's hit", "other request's hit", "computed tokens", "too many tokens",
    "lookahead keyword", "past max_model_len", "empty id", "duplicate id",
])
def test_uncovered_first_calls_go_to_the_python_method(case: str) -> None:
    """Each call the admission does not cover reaches the Python method unchanged,
    which raises its documented error; state is unchanged."""
    mgr, spy = spied()
    held, _ = admit(mgr, "held", list(range(8)))
    mgr.free(held)  # cached blocks to hit
    req = Request("x" if case != "empty id" else "", list(range(8)) + [1, 2],
                  hasher=mgr.hasher)
    hit = mgr.get_computed_blocks(req)
    kwargs: dict[str, Any] = {"new_computed_blocks": hit}
    num_new, error = req.num_tokens - hit.num_computed_tokens, InvalidArgumentError
    if case == "other manager's hit":
        other = manager()
        admit(other, "held", list(range(8)))
        kwargs["new_computed_blocks"] = other.get_computed_blocks(req)
        error = InvalidHitError
    elif case == "other request's hit":
        twin = Request("y", list(range(8)) + [1, 2], hasher=mgr.hasher)
        kwargs["new_computed_blocks"] = mgr.get_computed_blocks(twin)
        error = InvalidHitError
    elif case == "computed tokens":
        req.num_computed_tokens = 3
    elif case == "too many tokens":
        num_new += 1
    elif case == "lookahead keyword":
        kwargs["num_lookahead_tokens"] = -1
    elif case == "past max_model_len":
        req = Request("x", list(range(70)), hasher=mgr.hasher)
        kwargs, num_new = {}, 70
    elif case == "duplicate id":
        admit(mgr, "x", [9, 9, 9])
        error = DuplicateRequestError
    before = snapshot(mgr)
    with pytest.raises(error):
        mgr.allocate_slots(req, num_new, **kwargs)
    assert spy.calls == 1 and snapshot(mgr) == before


def test_other_keywords_take_the_python_path_and_agree() -> None:
    """A first call with a keyword besides the hit (here lookahead slots) is the Python
    method's; its answer equals the pure core's."""
    (compiled, spy), pure = spied(), manager(pure=True)
    outs = []
    for m in (compiled, pure):
        req = Request("k", list(range(9)), hasher=m.hasher)
        outs.append(m.allocate_slots(req, 9, new_computed_blocks=m.get_computed_blocks(req),
                                     num_lookahead_tokens=3))
    assert outs[0] == outs[1] == ([1, 2, 3],)
    assert spy.calls == 1 and snapshot(compiled) == snapshot(pure)


def test_a_foreign_request_type_goes_to_the_python_method() -> None:
    mgr, spy = spied()

    class Mine(Request):
        pass

    req = Mine("m", list(range(6)), hasher=mgr.hasher)
    assert mgr.allocate_slots(req, 6) == ([1, 2],)
    assert spy.calls == 1 and mgr.live_requests["m"] is req


def test_a_pickled_manager_admits_in_c_as_the_original() -> None:
    """The compiled admission is built again on unpickling; both answer alike."""
    mgr = manager()
    held, _ = admit(mgr, "a", list(range(12)))
    mgr.free(held)
    copy = pickle.loads(pickle.dumps(mgr))
    assert type(copy.allocate_slots) is type(mgr.allocate_slots)
    outs = [admit(m, "b", list(range(12)) + [3, 4])[1] for m in (mgr, copy)]
    assert outs[0] == outs[1] == ([4],)  # blocks 1-3 hit
    assert snapshot(mgr) == snapshot(copy)
