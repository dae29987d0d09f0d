"""The compiled allocation's pool calls, stored records and frees against their Python
specifications.

* ``PoolOps`` (``pagedkv/_csrc/ccore_pool_ops.h``) against :class:`BlockPool`'s own
  ``get_new_blocks``, ``touch`` and ``free_blocks`` on twin pools, random operation
  sequences over cached, held and free blocks (evictions told to an event buffer);
* ``BufferStored`` (``ccore_buffer_stored.h``) against :meth:`EventBuffer.stored` on
  random runs: skipped positions, blocks of one or several hash blocks, requests with and
  without extras (LoRA, multimodal and salt keys, recorded keys or not);
* ``GroupsAllocate``'s free, masked sliding-window registration and full-sequence gate
  (``ccore_groups_free.h``, ``ccore_index_mask.h``, ``ccore_hybrid_first.h``) against
  the pure core, whole managers side by side: tables, pool, index and event bytes after
  every call.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import (
    CacheConfig,
    FullAttentionSpec,
    KVCacheManager,
    SlidingWindowSpec,
)
from pagedkv.core import native
from pagedkv.core.group_allocation import CACHE_MASKED, compiled_registration
from pagedkv.core.hashing import event_extra_keys
from pagedkv.core.pool import BlockPool
from pagedkv.core.recorder import EventBuffer, GroupInfo
from pagedkv.core.records import MEDIUM_GPU, BlockStored

pytestmark = pytest.mark.skipif(native.active() is None,
                                reason=f"no compiled core: {native.IMPORT_ERROR}")

FAST = settings(max_examples=120, deadline=None)
KEYS = [bytes([k]) * 4 for k in range(12)]


class _Request:
    """What the pool's registration and the recorder read of a request."""

    def __init__(self, hashes: list[bytes], extras: Any = None,
                 recorded: list[Any] | None = None) -> None:
        self.block_hashes = hashes
        self.all_token_ids = list(range(4 * len(hashes) + 3))
        self.hash_extras = extras
        self.block_extra_keys = recorded if recorded is not None else []


class _Lora:
    adapter_id = 7
    name = "sql"


class _Extras:
    """HashExtras' surface the recorder reads: ``lora`` and ``block_keys``."""

    def __init__(self, lora: Any, keys: list[Any]) -> None:
        self.lora = lora
        self.keys = keys

    def block_keys(self, start: int, end: int) -> list[Any] | None:
        return self.keys[(start // 4) % len(self.keys)]


def _pool(num_blocks: int) -> BlockPool:
    groups = [GroupInfo(4, "full_attention", None), GroupInfo(8, "sliding_window", 8)]
    return BlockPool(num_blocks, hash_block_size=4, groups=groups,
                     recorder=EventBuffer(groups, 4))


def _state(pool: BlockPool) -> tuple[Any, ...]:
    return pool.debug_state(), pool.recorder.pending(), pool.num_evicted_blocks


def _outcome(call: Any, *args: Any) -> Any:
    try:
        return ("ok", call(*args))
    except Exception as e:  # the exception's type is the outcome
        return ("raised", type(e))


ops = st.lists(st.tuples(st.sampled_from(["take", "touch", "free", "cache", "big"]),
                         st.integers(0, 10**6)), max_size=40)


@FAST
@given(num_blocks=st.integers(3, 24), plan=ops)
def test_pool_ops_match_the_pools_methods(num_blocks: int, plan: list[tuple[str, int]]
                                          ) -> None:
    """Twin pools, one driven through its own methods and one through ``PoolOps``: the
    same ids, the same errors, the same pool, index and events after every call."""
    ccore: Any = native.active()
    py, c = _pool(num_blocks), _pool(num_blocks)
    ops_c = ccore.PoolOps(c)
    held: list[int] = []
    for what, seed in plan:
        free = py.free_queue.num_free
        if what in ("take", "big"):
            n = seed % (free + 1) if what == "take" else free + 1 + seed % 3
            a, b = _outcome(py.get_new_blocks, n), _outcome(ops_c.get_new_blocks, n)
            if a[0] == "ok":
                held.extend(a[1])
        elif what == "touch":
            cached = [x for x in range(1, num_blocks) if py.block_hash[x] is not None]
            ids = cached[seed % 3::2] + ([0] if seed % 5 == 0 else [])
            a, b = _outcome(py.touch, ids), _outcome(ops_c.touch, ids)
            held.extend(x for x in ids if x)
        elif what == "free":
            k = seed % (len(held) + 1)
            ids, held = held[:k][::-1], held[k:]
            a, b = _outcome(py.free_blocks, ids), _outcome(ops_c.free_blocks, ids)
        else:  # register some held blocks (the next take may evict them)
            blocks = held[: 1 + seed % 4]
            req = _Request([KEYS[(seed + i) % len(KEYS)] for i in range(len(blocks))])
            for p in (py, c):
                p.cache_full_blocks(req, list(blocks), 0, len(blocks), 0)
            a = b = ("ok", None)
        assert a == b, what
        assert _state(py) == _state(c), what


def test_pool_ops_call_a_method_rebound_on_the_pool() -> None:
    """A pool whose method an instance attribute replaces is called through it, as the
    Python callers would."""
    ccore: Any = native.active()
    pool = _pool(8)
    seen: list[Any] = []
    real = pool.get_new_blocks

    def spy(n: int) -> list[int]:
        seen.append(n)
        return real(n)

    pool.get_new_blocks = spy  # type: ignore[method-assign]
    assert ccore.PoolOps(pool).get_new_blocks(2) == [1, 2]
    assert seen == [2]


@st.composite
def runs(draw: st.DrawFn) -> tuple[Any, ...]:
    bs = draw(st.sampled_from([4, 8]))
    k = bs // 4
    n = draw(st.integers(1, 6))
    hashes = [KEYS[i % len(KEYS)] for i in range(n * k)]
    strided = hashes[k - 1::k]
    start = draw(st.integers(0, n - 1))
    end = draw(st.integers(start + 1, n))
    skipped = sorted(draw(st.sets(st.integers(start, end - 1))))
    blocks = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    keys = draw(st.lists(st.sampled_from([
        None, [["lora", "sql", "/a"]], [["mm", "img", 2], ["cache_salt", "t"]],
        [["mm", "v", 0]], ["odd"]]), min_size=1, max_size=4))
    with_extras = draw(st.booleans())
    extras = _Extras(draw(st.sampled_from([None, _Lora()])), keys) if with_extras else None
    recorded = [keys[i % len(keys)] for i in range(draw(st.integers(0, n * k + 1)))]
    skipped_as = draw(st.sampled_from(["list", "tuple"]))
    group = 0 if bs == 4 else 1
    req = _Request(hashes, extras, recorded)
    return (req, blocks, strided, start, end,
            skipped if skipped_as == "list" else tuple(skipped), group)


def _buffer() -> EventBuffer:
    return EventBuffer([GroupInfo(4, "full_attention", None),
                        GroupInfo(8, "sliding_window", 8)], 4)


@FAST
@given(batch=st.lists(runs(), min_size=1, max_size=4))
def test_buffer_stored_matches_event_buffer_stored(batch: list[tuple[Any, ...]]) -> None:
    """The same runs told to an EventBuffer and to BufferStored over a twin: the same
    records (or the same error), the same announced blocks."""
    ccore: Any = native.active()
    py, c = _buffer(), _buffer()
    stored = ccore.BufferStored(c, BlockStored, MEDIUM_GPU, event_extra_keys)
    for run in batch:
        a, b = _outcome(py.stored, run), _outcome(stored, run)
        assert a == b
        assert py.pending() == c.pending()
        assert {k: (v[0], v[1:]) for k, v in py._announced.items()} == {
            k: (v[0], v[1:]) for k, v in c._announced.items()}


HEADS = {"num_kv_heads": 1, "head_size": 4, "dtype_bytes": 2}


def _pair(num_blocks: int) -> tuple[KVCacheManager, KVCacheManager]:
    """Full attention 8 + sliding window 8 at block 2: a window's run of one block, four
    per segment of the hit alignment, so its registration is masked."""
    groups = (FullAttentionSpec(block_size=8, **HEADS),
              SlidingWindowSpec(block_size=2, sliding_window=2, **HEADS))
    config = CacheConfig(groups=groups, num_blocks=num_blocks, max_model_len=96,
                         enable_events=True, max_in_flight_tokens=16)
    compiled = KVCacheManager(config)
    with native.forced_pure():
        pure = KVCacheManager(config)
    return compiled, pure


def test_the_masked_window_and_the_free_are_compiled() -> None:
    compiled, _ = _pair(40)
    _, entries = compiled_registration(compiled.coordinator)
    assert entries[1] is not None and entries[1][0] == CACHE_MASKED
    assert getattr(compiled.free, "__self__", None) is compiled.allocate_slots  # in C


steps = st.lists(st.tuples(st.sampled_from(["new", "step", "free", "free_id", "preempt"]),
                           st.integers(0, 10**6)), min_size=1, max_size=50)


@FAST
@given(num_blocks=st.integers(12, 60), plan=steps)
def test_groups_free_and_masked_registration_match_the_pure_core(
        num_blocks: int, plan: list[tuple[str, int]]) -> None:
    """Both cores driven by the same calls (admissions with shared prefixes, decode
    steps, frees by request and by id, preemptions): the same answers, tables, pool,
    index and events after every call."""
    compiled, pure = _pair(num_blocks)
    reqs: dict[str, list[Any]] = {}
    for i, (what, seed) in enumerate(plan):
        if what != "new" and not reqs:
            continue
        rid = f"r{i}" if what == "new" else sorted(reqs)[seed % len(reqs)]
        out = [_drive(mgr, what, seed, rid, reqs, k) for mgr, k in ((compiled, 0), (pure, 1))]
        assert out[0] == out[1], what
        if what in ("free", "free_id") or (what == "preempt" and out[0] is None):
            del reqs[rid]
        assert compiled.debug_state() == pure.debug_state(), what
        assert compiled.take_events() == pure.take_events(), what
    compiled.check_invariants()


def _drive(mgr: KVCacheManager, what: str, seed: int, rid: str,
           reqs: dict[str, list[Any]], k: int) -> Any:
    """One call of the plan on one core (``k``: its slot in ``reqs``)."""
    if what == "new":
        prompt = [seed % 3] * (seed % 7) + list(range(seed % 29 + 1))
        req = mgr.new_request(rid, prompt)
        hit = mgr.get_computed_blocks(req)
        gate = {"full_sequence_must_fit": True} if seed % 2 else {}  # the gate in C too
        out = mgr.allocate_slots(req, req.num_tokens - hit.num_computed_tokens,
                                 new_computed_blocks=hit, **gate)
        if out is not None:
            req.num_computed_tokens = req.num_tokens
            reqs.setdefault(rid, [None, None])[k] = req
        return out
    req = reqs[rid][k]
    if what in ("free", "free_id"):
        return mgr.free(rid if what == "free_id" else req)
    if what == "preempt":
        mgr.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
    else:
        req.append_output_tokens([seed % 5])
    out = mgr.allocate_slots(req, req.num_tokens - req.num_computed_tokens)
    if out is not None:
        req.num_computed_tokens = req.num_tokens
    return out
