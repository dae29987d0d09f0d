"""``--semantics reference`` reproduces an independent LRU on the Mooncake traces at block
512 to 4 decimals; both semantics keep LRU <= Belady <= infinite; reference credits the
partial last block."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pytest
from trace_data import read_text

from pagedkv import InvalidArgumentError
from pagedkv.sim import SimRequest, Workload, load_trace, run_pure_cache
from pagedkv.sim.bounds import access_sequence, belady_hits, infinite_cache_hits
from pagedkv.sim.generators import system_prompts


def reference_lru(path: Path, capacity: int, block: int = 512, *, semantics: str = "reference",
                  limit: int | None = None) -> float:
    """The published convention, written independently of pagedkv: every hash id (the
    partial last block included) is an entry of an LRU cache of ``capacity`` entries; a
    request hits its longest cached prefix and is credited min(matched * block, input);
    then its entries become the most recent, its first block most recent of all (the
    order in which an engine frees a request's blocks, tail first). A prompt of more
    entries than the cache stores its first ``capacity`` entries.

    ``semantics="vllm"``: only full blocks are entries, a lookup matches at most
    ``(input - 1) // block`` of them and is credited matched * block."""
    rows = sorted((json.loads(line) for line in read_text(path).splitlines() if line.strip()),
                  key=lambda r: r["timestamp"])[:limit]
    chain: dict[tuple[int, int], int] = {}
    cache: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for r in rows:
        n = r["input_length"]
        ids = r["hash_ids"] if semantics == "reference" else r["hash_ids"][:n // block]
        queried = len(ids) if semantics == "reference" else (n - 1) // block
        keys, parent = [], -1
        for h in ids:
            parent = chain.setdefault((parent, h), len(chain))
            keys.append(parent)
        m = 0
        while m < queried and keys[m] in cache:
            m += 1
        hit += min(m * block, n)
        total += n
        for k in keys:
            cache.pop(k, None)
        keys = keys[:capacity]
        while len(cache) + len(keys) > capacity:
            cache.popitem(last=False)
        for k in reversed(keys):
            cache[k] = None
    return hit / total


@pytest.mark.parametrize(
    ("trace", "capacities"),
    [("conversation_trace.jsonl", (300, 4000)), ("synthetic_trace.jsonl", (1000,))],
)
def test_reference_matches_independent_lru(
    trace: str, capacities: tuple[int, ...], data: Callable[[str], Path]
) -> None:
    path = data(f"traces/{trace}.gz")
    wl = load_trace(path)
    for cap in capacities:
        ours = run_pure_cache(wl, block_size=512, num_blocks=cap + 1, semantics="reference")
        assert ours.hit_rate() > 0.01
        assert round(ours.hit_rate(), 4) == round(reference_lru(path, cap), 4), cap


@pytest.mark.parametrize("cap", [2, 5, 19])
def test_cache_smaller_than_a_prompt_matches_independent_lru(
    cap: int, data: Callable[[str], Path], tmp_path: Path
) -> None:
    # Prompts longer than the whole cache store their first `cap` blocks; a prompt that
    # fills the cache and is seen again hits all of it. Regression: reference semantics
    # raised AssertionError on such a repeat.
    rows = [(0, 12800, list(range(25))), (1000, 12800, list(range(25))),
            (2000, 3000, [100, 101, 102, 103, 104, 105]), (3000, 12700, list(range(25))),
            (4000, 1300, [0, 1, 50]), (5000, 12800, list(range(25)))]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 1,
                                        "hash_ids": ids}) + "\n" for t, n, ids in rows))
    conversation = data("traces/conversation_trace.jsonl.gz")
    # vLLM's semantics computes a prompt's partial last block in a block of its own (an
    # eviction the LRU model has no entry for): compared on the Mooncake trace only,
    # where at these capacities no prompt's queried blocks all hit in a full cache.
    for trace, limit, semantics in ((path, None, "reference"), (conversation, 3000, "reference"),
                                    (conversation, 3000, "vllm")):
        wl = load_trace(trace, limit=limit)
        ours = run_pure_cache(wl, block_size=512, num_blocks=cap + 1, semantics=semantics,
                              check_invariants=limit is None)
        want = reference_lru(trace, cap, semantics=semantics, limit=limit)
        assert ours.hit_rate() == pytest.approx(want, abs=1e-12), (trace, semantics)
        assert ours.hit_rate() > 0


def test_prompt_filling_the_cache_seen_again_is_credited_and_touched() -> None:
    # 3 usable blocks of 512; A = 4 full blocks (a prompt longer than the cache): A stores
    # a1 a2 a3; A again hits all three (3 x 512 credited under both semantics: the crash
    # was here); B (2 new blocks) evicts a3 and a2, the least recent of A's (freed tail
    # first), so C = a1 a2 c3 hits a1 only.
    mk = lambda i, n, ids: SimRequest(  # noqa: E731
        request_id=f"r{i}", arrival_s=float(i), num_prompt_tokens=n, num_output_tokens=1,
        hash_ids=ids)
    wl = Workload(name="t", source_block_size=512, requests=(
        mk(0, 2048, (1, 2, 3, 4)), mk(1, 2048, (1, 2, 3, 4)), mk(2, 1024, (7, 8)),
        mk(3, 1025, (1, 2, 9))))
    for semantics in ("reference", "vllm"):
        res = run_pure_cache(wl, block_size=512, num_blocks=4, semantics=semantics,
                             check_invariants=True)
        assert res.hit_tokens == [0, 1536, 0, 512], semantics


def test_a_one_block_cache_replays_and_a_zero_block_cache_is_refused() -> None:
    wl = Workload(name="t", source_block_size=512, requests=tuple(SimRequest(
        request_id=f"r{i}", arrival_s=float(i), num_prompt_tokens=1100, num_output_tokens=1,
        hash_ids=(1, 2, 3)) for i in range(3)))
    for semantics in ("reference", "vllm"):
        res = run_pure_cache(wl, block_size=512, num_blocks=2, semantics=semantics,
                             check_invariants=True)
        assert res.hit_tokens == [0, 512, 512], semantics
        with pytest.raises(InvalidArgumentError, match="num_blocks must be >= 2"):
            run_pure_cache(wl, block_size=512, num_blocks=1, semantics=semantics)


def test_reference_bounds_order_and_partial_credit() -> None:
    # A (1200 tokens, ids 1 2 3) then B = A: vLLM credits 2 full blocks of B (1024), the
    # reference the whole prompt (1200). Then C shares A's first two ids only.
    mk = lambda i, n, ids: SimRequest(  # noqa: E731
        request_id=f"r{i}", arrival_s=float(i), num_prompt_tokens=n, num_output_tokens=1,
        hash_ids=ids)
    wl = Workload(name="t", source_block_size=512, requests=(
        mk(0, 1200, (1, 2, 3)), mk(1, 1200, (1, 2, 3)), mk(2, 1100, (1, 2, 9))))
    ref = run_pure_cache(wl, block_size=512, num_blocks=100, semantics="reference",
                         check_invariants=True)
    assert ref.hit_tokens == [0, 1200, 1024]
    vllm = run_pure_cache(wl, block_size=512, num_blocks=100, check_invariants=True)
    assert vllm.hit_tokens == [0, 1024, 1024]
    seq = access_sequence(wl, 512, semantics="reference")
    assert infinite_cache_hits(seq).hit_tokens == [0, 1200, 1024]
    # Belady at 2 blocks: the tail of A (176 tokens) is worth less than a full block.
    bel = belady_hits(seq, 2)
    assert bel.hit_tokens[1] <= 1200 and bel.hit_rate() <= infinite_cache_hits(seq).hit_rate()
    for sub in (64, 256):  # a divisor works too; the partial source block is split
        assert run_pure_cache(wl, block_size=sub, num_blocks=200,
                              semantics="reference").hit_tokens == [0, 1200, 1024]


@pytest.mark.parametrize("cap", [3, 6, 20, 60])
def test_reference_lru_le_belady_le_infinite(cap: int, data: Callable[[str], Path]) -> None:
    wl = load_trace(data("traces/conversation_trace.jsonl.gz"), limit=400)
    seq = access_sequence(wl, 512, semantics="reference")
    lru = run_pure_cache(wl, block_size=512, num_blocks=cap + 1, semantics="reference")
    bel = belady_hits(seq, cap)
    inf = infinite_cache_hits(seq)
    assert lru.hit_rate() <= bel.hit_rate() + 1e-12 <= inf.hit_rate() + 2e-12


def test_reference_rejects_what_it_cannot_replay() -> None:
    with pytest.raises(InvalidArgumentError, match="dividing 512"):
        run_pure_cache(load_trace_head(), block_size=1024, num_blocks=10, semantics="reference")
    with pytest.raises(InvalidArgumentError, match="semantics vllm"):
        run_pure_cache(system_prompts(), block_size=16, num_blocks=100, semantics="reference")
    with pytest.raises(InvalidArgumentError, match="unknown semantics"):
        run_pure_cache(load_trace_head(), block_size=16, num_blocks=100, semantics="paper")


def load_trace_head() -> Workload:
    from pagedkv.sim.workloads import bundled_trace_path

    return load_trace(bundled_trace_path(), limit=50)
