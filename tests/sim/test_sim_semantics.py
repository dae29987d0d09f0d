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


def reference_lru(path: Path, capacity: int, block: int = 512) -> float:
    """The published convention, written independently of pagedkv: every hash id (the
    partial last block included) is an entry of an LRU cache of ``capacity`` entries; a
    request hits its longest cached prefix and is credited min(matched * block, input);
    then its entries become the most recent, its first block most recent of all (the
    order in which an engine frees a request's blocks, tail first)."""
    rows = sorted((json.loads(line) for line in read_text(path).splitlines() if line.strip()),
                  key=lambda r: r["timestamp"])
    chain: dict[tuple[int, int], int] = {}
    cache: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for r in rows:
        keys, parent = [], -1
        for h in r["hash_ids"]:
            parent = chain.setdefault((parent, h), len(chain))
            keys.append(parent)
        m = 0
        while m < len(keys) and keys[m] in cache:
            m += 1
        hit += min(m * block, r["input_length"])
        total += r["input_length"]
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
