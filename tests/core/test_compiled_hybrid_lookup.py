"""The compiled ``get_computed_blocks`` of hybrid layouts (``HybridLookup``,
``pagedkv/_csrc/ccore_hybrid_lookup.h``, set on ``GroupsAllocate``) against its pure-Python
specification, ``facade_lookups.get_computed_blocks``.

Focused checks: it is installed on each layout whose coordinator looks up through the
compiled kernel (one sliding-window or chunked-local group, and several groups); on random
prompts its hits and the lookup statistics equal the pure core's; every call it does not
cover (keywords, another type, too long) goes to the Python method with its errors; copies
and pickles build it again; its constructor and ``set_lookup`` check their arguments. The
step-by-step comparison of whole managers is test_kernels_differential.py's machine.

Without the compiled core (``PAGEDKV_PURE=1``, not built) they skip: nothing to compare.
"""

from __future__ import annotations

import copy
import pickle
import random
from typing import Any

import pytest

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from pagedkv.core import facade_lookups, native
from pagedkv.errors import InvalidArgumentError

pytestmark = pytest.mark.skipif(native.active() is None,
                                reason=f"no compiled core: {native.IMPORT_ERROR}")

HEADS = {"num_kv_heads": 1, "head_size": 4, "dtype_bytes": 2}
MAX_LEN = 64

#: name -> the groups of a layout whose lookup is the compiled kernel.
LAYOUTS: dict[str, tuple[Any, ...]] = {
    "swa": (SlidingWindowSpec(block_size=4, sliding_window=8, **HEADS),),
    "chunked": (ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **HEADS),),
    "full+swa": (FullAttentionSpec(block_size=4, **HEADS),
                 SlidingWindowSpec(block_size=4, sliding_window=8, **HEADS)),
    "full+mamba": (FullAttentionSpec(block_size=4, **HEADS), MambaSpec(block_size=4,
                                                                       state_bytes=16)),
}


def _manager(groups: tuple[Any, ...], pure: bool = False) -> KVCacheManager:
    config = CacheConfig(groups=groups, num_blocks=48, max_model_len=MAX_LEN)
    if pure:
        with native.forced_pure():
            return KVCacheManager(config)
    return KVCacheManager(config)


def _answer(hit: Any) -> tuple[Any, ...]:
    return (hit.num_computed_tokens, tuple(map(list, hit.block_ids)), hit.request_id,
            hit.generation, hit.fingerprint, hit.group_tokens)


def _counters(mgr: KVCacheManager) -> tuple[int, ...]:
    c = mgr.lookups
    return (c.requests, c.queries, c.hits, c.preempted_requests, c.preempted_queries,
            c.preempted_hits)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_installed(name: str) -> None:
    mgr = _manager(LAYOUTS[name])
    fast = mgr.allocate_slots
    assert type(fast).__name__ == "GroupsAllocate" and fast.takes_lookups
    assert mgr.get_computed_blocks.__self__ is fast  # type: ignore[attr-defined]
    assert mgr.get_computed_blocks.__doc__


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", range(3))
def test_equals_pure_on_random_prompts(name: str, seed: int) -> None:
    rng = random.Random(seed)
    mgrs = (_manager(LAYOUTS[name]), _manager(LAYOUTS[name], pure=True))
    assert not getattr(mgrs[1].allocate_slots, "takes_lookups", False)
    stems = [[rng.randrange(50) for _ in range(rng.randrange(4, 40))] for _ in range(3)]
    for i in range(24):
        prompt = (rng.choice(stems) + [rng.randrange(50) for _ in range(rng.randrange(8))])
        prompt = prompt[:MAX_LEN]
        preempted, admit, finish = (rng.random() < p for p in (0.2, 0.7, 0.6))
        answers = []
        for m in mgrs:
            req = m.new_request(f"r{i}", list(prompt))
            if preempted:
                req.num_preemptions = 1  # counted apart
            hit = m.get_computed_blocks(req)
            answers.append((_answer(hit), _counters(m)))
            if admit and m.allocate_slots(
                    req, len(prompt) - hit.num_computed_tokens, new_computed_blocks=hit
            ) is not None and finish:
                m.free(req)
        assert answers[0] == answers[1]
    assert mgrs[0].make_prefix_cache_stats() == mgrs[1].make_prefix_cache_stats()


@pytest.mark.parametrize("name", ["swa", "full+mamba"])
def test_uncovered_calls_go_to_python(name: str) -> None:
    mgr = _manager(LAYOUTS[name])
    req = mgr.new_request("a", list(range(20)))
    by_keyword = mgr.get_computed_blocks(request=req)  # type: ignore[call-arg]
    assert _answer(by_keyword) == _answer(facade_lookups.get_computed_blocks(mgr, req))
    with pytest.raises(InvalidArgumentError, match="expected a request"):
        mgr.get_computed_blocks(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        mgr.get_computed_blocks(mgr.new_request("long", list(range(MAX_LEN + 1))))
    with pytest.raises(TypeError):
        mgr.get_computed_blocks()  # type: ignore[call-arg]
    assert mgr.lookups.requests == 2


def test_a_request_like_goes_to_python() -> None:
    mgr = _manager(LAYOUTS["swa"])
    req = mgr.new_request("a", list(range(20)))

    class Like:
        """A RequestLike that is not a pagedkv Request: the Python method's call."""

        def __getattr__(self, name: str) -> Any:
            return getattr(req, name)

    like = Like()
    assert _answer(mgr.get_computed_blocks(like)) == _answer(mgr.get_computed_blocks(req))


@pytest.mark.parametrize("how", ["copy", "pickle"])
def test_copies_build_it_again(how: str) -> None:
    mgr = _manager(LAYOUTS["chunked"])
    req = mgr.new_request("a", list(range(30)))
    hit = mgr.get_computed_blocks(req)
    mgr.allocate_slots(req, 30 - hit.num_computed_tokens, new_computed_blocks=hit)
    mgr.free(req)
    other = copy.deepcopy(mgr) if how == "copy" else pickle.loads(pickle.dumps(mgr))
    assert other.get_computed_blocks.__self__ is other.allocate_slots  # type: ignore[attr-defined]
    again = other.get_computed_blocks(other.new_request("b", list(range(30))))
    want = facade_lookups.get_computed_blocks(mgr, mgr.new_request("b", list(range(30))))
    assert _answer(again) == _answer(want) and other.lookups.requests == 2


def test_constructor_and_set_lookup_check_their_arguments() -> None:
    ccore = native.active()
    mgr = _manager(LAYOUTS["swa"])
    find = mgr.get_computed_blocks.__self__  # any callable
    with pytest.raises(TypeError):
        ccore.HybridLookup(function=None)
    with pytest.raises(ValueError):
        ccore.HybridLookup(function=1, manager=mgr, request_type=Request, find=find,
                           max_model_len=4)
    with pytest.raises(ValueError):
        ccore.HybridLookup(function=len, manager=mgr, request_type=Request, find=find,
                           max_model_len=-1)
    with pytest.raises(TypeError):  # no vectorcall before __init__
        ccore.HybridLookup.__new__(ccore.HybridLookup)(None)
    with pytest.raises(TypeError, match="HybridLookup"):
        mgr.allocate_slots.set_lookup(len)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="HybridLookup"):
        mgr.allocate_slots.set_lookup(  # type: ignore[attr-defined]
            ccore.HybridLookup.__new__(ccore.HybridLookup))
    del mgr
    gone = _manager(LAYOUTS["swa"])
    lookup = gone.get_computed_blocks
    req = gone.new_request("a", [1, 2, 3])
    del gone
    with pytest.raises(InvalidArgumentError, match="was freed"):
        lookup(req)


def test_counters_and_a_full_window_equal_pure() -> None:
    """The counters and the hit-rate window updated in place (their slots) as the Python
    steps do, past the window's length and on values an engine set."""
    mgrs = []
    for pure in (False, True):
        config = CacheConfig(groups=LAYOUTS["swa"], num_blocks=48, max_model_len=MAX_LEN,
                             hit_rate_window_requests=3)
        if pure:
            with native.forced_pure():
                mgrs.append(KVCacheManager(config))
        else:
            mgrs.append(KVCacheManager(config))
    for m in mgrs:
        m.lookups.hits = 2**70  # a big int sums as any int
        for i in range(7):
            req = m.new_request(f"r{i}", list(range(10 + 5 * i)))
            hit = m.get_computed_blocks(req)
            assert m.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                                    new_computed_blocks=hit) is not None
    views = [(_counters(m), m.hit_rate_window.queries, m.hit_rate_window.hits,
              list(m.hit_rate_window._entries)) for m in mgrs]
    assert views[0] == views[1] and len(views[0][3]) == 3


def test_an_unset_counter_raises_as_python() -> None:
    mgrs = [_manager(LAYOUTS["swa"]), _manager(LAYOUTS["swa"], pure=True)]
    for m in mgrs:
        del m.lookups.queries
        with pytest.raises(AttributeError):
            m.get_computed_blocks(m.new_request("a", list(range(20))))
    assert [m.lookups.requests for m in mgrs] == [1, 1]
