"""Each compiled hybrid kernel (``pagedkv/_csrc/ccore_hybrid*.h``) against its pure twin
in :mod:`pagedkv.core.kernels_hybrid`: same values, same changes, same errors; and the
hasher's compiled keyed path against the pure hasher."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import (
    BlockHasher,
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    MambaSpec,
    SlidingWindowSpec,
)
from pagedkv.core import kernels_hybrid, kernels_hybrid_step, native
from pagedkv.core.hashing import HashExtras, LoRA, MultiModalItem

ccore = native.active()
pytestmark = pytest.mark.skipif(
    ccore is None, reason=f"compares compiled kernels with pure ones ({native.IMPORT_ERROR})")

TAILS = [b"\xf6", b"\x81\x63abc", b"\x82\x01\x02" * 30, b""]


def _outcome(fn: Any, hashes: list[bytes], *args: Any) -> tuple[Any, list[bytes]]:
    try:
        return fn(hashes, *args), hashes
    except (TypeError, ValueError) as exc:
        return (type(exc), str(exc)), hashes


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.one_of(st.integers(0, (1 << 17) + 5), st.integers(-3, 30)),
                    max_size=40),
    block_size=st.integers(-1, 9),
    start_blocks=st.integers(-1, 4),
    num_blocks=st.integers(0, 6),
    parent=st.sampled_from([bytes(32), b"\x07" * 32, b"short", "str"]),
    tails=st.lists(st.sampled_from(TAILS + ["text"]), max_size=7),
    hashes_before=st.integers(0, 2),
)
def test_hash_keyed_equals_its_twin(tokens: list[int], block_size: int, start_blocks: int,
                                    num_blocks: int, parent: Any, tails: list[Any],
                                    hashes_before: int) -> None:
    start = start_blocks * block_size
    stop = start + num_blocks * block_size
    if len(tails) == num_blocks and num_blocks and tails[0] == "text":
        tails = [b"\xf6"] * num_blocks  # mostly well-formed calls
    before = [bytes([i]) * 32 for i in range(hashes_before)]
    c = _outcome(ccore.hash_keyed, list(before), tokens, start, stop, block_size, parent,
                 list(tails))
    p = _outcome(kernels_hybrid.hash_keyed, list(before), tokens, start, stop, block_size,
                 parent, list(tails))
    assert c == p


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3000), min_size=0, max_size=70),
    bs=st.sampled_from([1, 4, 8, 16]),
    lora=st.sampled_from([None, ("sql", 3, "/a"), ("sql", 3, "/b")]),
    mm=st.lists(st.tuples(st.sampled_from(["img-a", "img-b"]), st.integers(0, 60),
                          st.integers(1, 12)), max_size=3),
    salt=st.sampled_from([None, "", "tenant"]),
    split=st.integers(0, 70),
    record=st.booleans(),
)
def test_compiled_keyed_hashing_equals_the_pure_hasher(
        tokens: list[int], bs: int, lora: Any, mm: list[tuple[str, int, int]],
        salt: str | None, split: int, record: bool) -> None:
    extras = HashExtras(lora=None if lora is None else LoRA(*lora),
                        mm_items=tuple(MultiModalItem(*m) for m in mm), cache_salt=salt)
    compiled = BlockHasher(bs, memo_blocks=0)
    with native.forced_pure():
        pure = BlockHasher(bs)
    assert compiled._keyed is not None and pure._keyed is None
    out: list[tuple[list[bytes], list[Any] | None]] = []
    for hasher in (compiled, pure):
        hashes: list[bytes] = []
        keys: list[Any] | None = [] if record else None
        hasher.extend(hashes, tokens[:split], extras, keys)  # in two calls, as a request
        hasher.extend(hashes, tokens, extras, keys)
        out.append((hashes, keys))
    assert out[0] == out[1]
    assert len(out[0][0]) == len(tokens) // bs


def test_a_token_off_the_table_falls_back_and_still_agrees() -> None:
    extras = HashExtras(lora=LoRA("sql", 3, "/a"))
    tokens = [5, 1 << 20, 7, 9, 11, 13, 15, 17]
    hashes: list[bytes] = []
    assert not ccore.hash_keyed([], tokens, 0, 8, 4, bytes(32), [b"\xf6", b"\xf6"])
    BlockHasher(4).extend(hashes, tokens, extras)
    with native.forced_pure():
        expected: list[bytes] = []
        BlockHasher(4).extend(expected, tokens, extras)
    assert hashes == expected and len(hashes) == 2


# ---------------------------------------------------------------- record_stored

class Rec(NamedTuple):
    block_hashes: Any
    parent_block_hash: Any
    token_ids: Any
    block_size: Any
    lora_id: Any
    medium: Any
    lora_name: Any
    extra_keys: Any
    group_idx: Any
    kv_cache_spec_kind: Any
    kv_cache_spec_sliding_window: Any
    lookahead_token_ids: Any


@settings(max_examples=300, deadline=None)
@given(
    num_blocks=st.integers(0, 8),
    start=st.integers(0, 8),
    length=st.integers(0, 8),
    skip=st.lists(st.integers(0, 15), max_size=5),
    bs=st.sampled_from([1, 4]),
    with_extra=st.booleans(),
    lora=st.sampled_from([(None, None), (3, "sql")]),
)
def test_record_stored_equals_its_twin(num_blocks: int, start: int, length: int,
                                       skip: list[int], bs: int, with_extra: bool,
                                       lora: tuple[Any, Any]) -> None:
    start = min(start, num_blocks)  # a run within the table (the pool's calls)
    end = min(start + length, num_blocks)
    blocks = list(range(10, 10 + num_blocks))
    hashes = [bytes([i]) * 4 for i in range(num_blocks)]
    skipped = sorted(set(skip))
    listed = [i for i in range(start, end) if i not in set(skipped)]
    extra = [["k", i] for i in listed] if with_extra else None
    tokens = list(range(100, 100 + num_blocks * bs))
    out = []
    for fn in (ccore.record_stored, kernels_hybrid.record_stored):
        events: list[Any] = [Rec(*range(12))]
        announced: dict[int, Any] = {10: "old"}
        fn(events, announced, Rec, blocks, hashes, start, end, skipped, tokens, bs,
           lora[0], "GPU", lora[1], extra, 1, "sliding_window", 8)
        assert all(type(e) is Rec for e in events) and len(events) == 2
        out.append((events, {b: (tuple(e[0]), *e[1:]) if e != "old" else e
                                  for b, e in announced.items()}))
    assert out[0] == out[1]


# ---------------------------------------------------------------- admit_groups

def _admission_pair(layout: str, num_blocks: int) -> tuple[KVCacheManager, KVCacheManager]:
    heads = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
    groups = {
        "swa": (SlidingWindowSpec(block_size=4, sliding_window=6, **heads),),
        "chunked": (ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **heads),),
        "full+swa": (FullAttentionSpec(block_size=4, **heads),
                     SlidingWindowSpec(block_size=4, sliding_window=6, **heads)),
        "full+chunked": (FullAttentionSpec(block_size=8, **heads),
                         ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8,
                                                   **heads)),
        "full+swa+mamba": (FullAttentionSpec(block_size=4, **heads),
                           SlidingWindowSpec(block_size=4, sliding_window=6, **heads),
                           MambaSpec(block_size=4, state_bytes=64)),
    }[layout]
    cfg = CacheConfig(groups=groups, num_blocks=num_blocks, max_model_len=64,
                      enable_events=True)
    compiled = KVCacheManager(cfg)
    with native.forced_pure():
        pure = KVCacheManager(cfg)
    return compiled, pure


@settings(max_examples=80, deadline=None)
@given(
    layout=st.sampled_from(["swa", "chunked", "full+swa", "full+chunked", "full+swa+mamba"]),
    num_blocks=st.integers(6, 40),
    prompts=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 40), st.integers(0, 9),
                               st.booleans()), min_size=1, max_size=8),
    keywords=st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.booleans(),
                                st.booleans()), min_size=8, max_size=8),
)
def test_admissions_agree_on_both_cores(layout: str, num_blocks: int,
                                        prompts: list[tuple[int, int, int, bool]],
                                        keywords: list[tuple[int, bool, bool, bool]]) -> None:
    """A run of admissions (shared prefixes, hits adopted, some requests freed, some
    refused for want of blocks; reserved blocks, the watermark on or off, delayed
    registration, the full-sequence gate) on the compiled core (a new request's first
    ``allocate_slots`` in C, ``ccore_hybrid_first.h``, and the compiled admission) and on
    the pure one: the same tables, events, free blocks and pool state after every step."""
    pair = _admission_pair(layout, num_blocks)
    assert pair[0].coordinator._admit is ccore.admit_groups
    assert pair[1].coordinator._admit is kernels_hybrid.admit_groups
    for n, (prefix, length, lookahead, free_after) in enumerate(prompts):
        reserved, scheduled, delay, must_fit = keywords[n]
        got = []
        for mgr in pair:
            req = mgr.new_request(f"r{n}", [7 * prefix + t % 5 for t in range(length)])
            hit = mgr.get_computed_blocks(req)
            new = mgr.allocate_slots(req, length - hit.num_computed_tokens,
                                     new_computed_blocks=hit,
                                     num_lookahead_tokens=lookahead,
                                     reserved_blocks=reserved, has_scheduled_reqs=scheduled,
                                     delay_caching=delay, full_sequence_must_fit=must_fit)
            tables = None if new is None else mgr.get_block_ids(f"r{n}")
            if new is not None and delay:
                mgr.cache_blocks(req, length)
            if new is not None and free_after:
                req.num_computed_tokens = length
                mgr.free(req)
            got.append((hit.num_computed_tokens, new, tables, mgr.take_events(),
                        mgr.pool.debug_state()))
            mgr.check_invariants()
        assert got[0] == got[1]


def _first_calls_off_the_path(mgr: KVCacheManager) -> list[Any]:
    a = mgr.new_request("a", list(range(12)))
    mgr.allocate_slots(a, 12)
    b = mgr.new_request("b", list(range(12)) + [99])
    c = mgr.new_request("c", list(range(12)) + [98])
    hit_b, hit_c = mgr.get_computed_blocks(b), mgr.get_computed_blocks(c)
    calls = (lambda: mgr.allocate_slots(c, 1, new_computed_blocks=hit_b),
             lambda: mgr.allocate_slots(mgr.new_request("a", [1]), 1),
             lambda: mgr.allocate_slots(b, 13 - hit_b.num_computed_tokens,
                                        new_computed_blocks=hit_b),
             lambda: mgr.allocate_slots(c, 13 - hit_c.num_computed_tokens,
                                        new_computed_blocks=hit_c))
    seen: list[Any] = []
    for call in calls:
        try:
            seen.append(call())
        except Exception as exc:
            seen.append((type(exc).__name__, str(exc)))
        seen.append(mgr.pool.debug_state())
        mgr.check_invariants()
    return seen


@pytest.mark.parametrize("layout", ["swa", "full+swa+mamba"])
def test_first_calls_the_compiled_core_leaves_fail_as_the_pure_core(layout: str) -> None:
    """First calls outside the compiled path (a hit issued for another request, a live id
    given again by another object) go to the Python method on both cores: the same errors,
    results and state; plain ones with a hit agree too."""
    outcomes = [_first_calls_off_the_path(mgr) for mgr in _admission_pair(layout, 30)]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0][0] == "InvalidHitError"
    assert outcomes[0][2][0] == "DuplicateRequestError"


# ---------------------------------------------------------------- longest hits

def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (IndexError, TypeError, ValueError) as exc:
        return type(exc)


@settings(max_examples=400, deadline=None)
@given(
    cached=st.lists(st.booleans(), max_size=14),
    stride=st.integers(1, 3),
    num_blocks=st.integers(-1, 8),
    need=st.integers(-1, 4),
    first=st.integers(-1, 7),
    block_size=st.sampled_from([4, 8, 16]),
    align=st.sampled_from([0, 4, 8, 16, 32]),
)
def test_hit_kernels_equal_their_twins(cached: list[bool], stride: int, num_blocks: int,
                                       need: int, first: int, block_size: int,
                                       align: int) -> None:
    hashes = [bytes([i]) * 8 for i in range(len(cached))]
    index = {h: 100 + i for i, (h, c) in enumerate(zip(hashes, cached, strict=True)) if c}
    for name, args in (
        ("window_hit", (index, hashes, stride, num_blocks, need)),
        ("chunk_hit", (index, hashes, stride, first, num_blocks)),
        ("state_hit", (index, hashes, stride, num_blocks, block_size, align)),
    ):
        compiled = _call(getattr(ccore, name), *args)
        pure = _call(getattr(kernels_hybrid, name), *args)
        assert compiled == pure, name


# ---------------------------------------------------------------- Mamba's running step

@settings(max_examples=400, deadline=None)
@given(
    table=st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=8)),
    released=st.one_of(st.none(), st.integers(0, 9)),
    last_state=st.one_of(st.none(), st.integers(-3, 9)),
    computed=st.integers(-5, 40),
    block_size=st.integers(1, 5),
)
def test_mamba_release_equals_its_twin(table: list[int] | None, released: int | None,
                                       last_state: int | None, computed: int,
                                       block_size: int) -> None:
    """Same frees (in order, one call per run), same table and marks, same errors (a last
    state past the table: IndexError), over positions already released, nulls, last
    states behind, at and past the live position."""
    results = []
    for fn in (ccore.mamba_release, kernels_hybrid_step.mamba_release):
        freed: list[list[int]] = []
        t = None if table is None else list(table)
        rel = {} if released is None else {"r": released}
        last = {} if last_state is None else {"r": last_state}
        out = _call(fn, t, rel, last, "r", computed, block_size,
                            lambda ids, freed=freed: freed.append(list(ids)))
        results.append((out, t, rel, last, freed))
    assert results[0] == results[1]


@settings(max_examples=400, deadline=None)
@given(
    table=st.lists(st.integers(0, 3), max_size=8),
    last_state=st.one_of(st.none(), st.integers(0, 9)),
    num_tokens=st.integers(-5, 40),
    block_size=st.integers(1, 5),
    allocated=st.booleans(),
)
def test_mamba_grow_equals_its_twin(table: list[int], last_state: int | None,
                                    num_tokens: int, block_size: int,
                                    allocated: bool) -> None:
    """Same new blocks (padding and the live block), same table, same marks, one take of
    the same count."""
    results = []
    for fn in (ccore.mamba_grow, kernels_hybrid_step.mamba_grow):
        takes: list[int] = []

        def take(n: int, takes: list[int] = takes) -> list[int]:
            takes.append(n)
            return [100 + i for i in range(n)]

        t = list(table)
        last = {} if last_state is None else {"r": last_state}
        done = {"r"} if allocated else set()
        out = _call(fn, t, last, done, "r", num_tokens, block_size, take)
        results.append((out, t, last, done, takes))
    assert results[0] == results[1]


def test_mamba_kernels_refuse_what_they_cannot_read() -> None:
    for args in (([1], {}, {}, "r", 4, 0, print), ((1,), {}, {}, "r", 4, 4, print),
                 ([1], [], {}, "r", 4, 4, print)):
        with pytest.raises((TypeError, ValueError), match="mamba_release"):
            ccore.mamba_release(*args)
    for args in (([1], {}, set(), "r", 4, -1, print), (None, {}, set(), "r", 4, 4, print),
                 ([1], {}, {}, "r", 4, 4, print)):
        with pytest.raises((TypeError, ValueError), match="mamba_grow"):
            ccore.mamba_grow(*args)


@settings(max_examples=300, deadline=None)
@given(
    groups=st.lists(st.tuples(st.one_of(st.none(), st.lists(st.integers(0, 9), max_size=5)),
                              st.booleans(), st.integers(0, 2), st.booleans()),
                    min_size=1, max_size=4),
    request_id=st.sampled_from(["r", "s"]),
)
def test_free_groups_equals_its_twin(groups: list[tuple[list[int] | None, bool, int, bool]],
                                     request_id: str) -> None:
    """Same frees in the same order (each group's table last first, empty tables not
    freed), same containers after, for held and unknown ids."""
    results = []
    for fn in (ccore.free_groups, kernels_hybrid_step.free_groups):
        freed: list[list[int]] = []
        plan = [({} if t is None else {"r": list(t)}, {"r": 1} if counted else {},
                 tuple({"r": 0} for _ in range(forget)), ({"r", "x"},) if drop else ())
                for t, counted, forget, drop in groups]
        out = fn(plan, request_id, lambda ids, freed=freed: freed.append(list(ids)))
        results.append((out, plan, freed))
    assert results[0] == results[1]
    with pytest.raises(TypeError, match="free_groups"):
        ccore.free_groups([({}, {}, ([],), ())], "r", print)
