"""Trace loading: derived sub-block hashes agree with native 512-token hashing; malformed
lines name file, line and key; --skip-bad-lines counts them; Azure CSV has no sharing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pagedkv import InputFileError, InvalidArgumentError
from pagedkv.sim import SimRequest, Workload, load_trace, request_block_hashes, run_pure_cache
from pagedkv.sim.bounds import access_sequence, infinite_cache_hits
from pagedkv.sim.pure_cache import unlimited_num_blocks
from pagedkv.sim.workloads import bundled_trace_path


def _unlimited_hits(wl: Workload, block_size: int) -> list[int]:
    seq = access_sequence(wl, block_size)
    res = run_pure_cache(wl, block_size=block_size, num_blocks=unlimited_num_blocks(seq))
    assert res.evicted_blocks == 0
    return res.hit_tokens


@pytest.mark.parametrize("block_size", [16, 128])
def test_derived_sub_blocks_match_native_hits(block_size: int) -> None:
    # Unlimited capacity. Derived sub-blocks of source block i carry block i's whole id, so
    # all sub-blocks of a full source block hit exactly when the native block does; the
    # derived hit may add sub-blocks of a *partial* last source block that an earlier prompt
    # shared with the same id. Rounded down to whole 512-token blocks, the two agree.
    wl = load_trace(bundled_trace_path(), limit=300)
    native = _unlimited_hits(wl, 512)
    derived = _unlimited_hits(wl, block_size)
    assert any(native)
    assert [d // 512 * 512 for d in derived] == native
    assert all(d >= n for d, n in zip(derived, native, strict=True))


def test_derived_equals_native_on_aligned_prompts() -> None:
    # Prompts of k*512 + 1 tokens: no partial source block holds a full sub-block, and the
    # cap (n - 1) falls on a source boundary, so derived and native hits are equal.
    ids = [(0, 1, 2), (0, 1, 3), (0, 1, 2), (0, 4), (0, 1, 3, 5)]
    reqs = tuple(
        SimRequest(request_id=f"r{i}", arrival_s=float(i), num_prompt_tokens=512 * len(h) + 1,
                   num_output_tokens=1, hash_ids=(*h, 99 + i))
        for i, h in enumerate(ids)
    )
    wl = Workload(name="aligned", requests=reqs, source_block_size=512)
    assert _unlimited_hits(wl, 512) == _unlimited_hits(wl, 16) == _unlimited_hits(wl, 64)
    assert _unlimited_hits(wl, 512) == [0, 1024, 1536, 512, 1536]


def test_derived_hashes_keep_prefix_semantics() -> None:
    a = SimRequest(request_id="a", arrival_s=0, num_prompt_tokens=1024, num_output_tokens=1,
                   hash_ids=(7, 8))
    b = SimRequest(request_id="b", arrival_s=0, num_prompt_tokens=1024, num_output_tokens=1,
                   hash_ids=(9, 8))  # same id 8 under another prefix: must not match
    ha = request_block_hashes(a, 256, source_block_size=512)
    hb = request_block_hashes(b, 256, source_block_size=512)
    assert ha is not None and hb is not None and len(ha) == len(hb) == 4
    assert not set(ha) & set(hb)
    assert len(set(ha)) == 4
    # a multiple of the source block size takes the chain hash ending at its boundary
    assert request_block_hashes(a, 1024, source_block_size=512) == [
        request_block_hashes(a, 512, source_block_size=512)[1]  # type: ignore[index]
    ]
    with pytest.raises(InvalidArgumentError, match="divisor"):
        access_sequence(Workload(name="x", requests=(a,), source_block_size=512), 48)


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}


@pytest.mark.parametrize(
    ("line", "key", "problem"),
    [
        ("{not json", None, "not valid JSON"),
        ('["a list"]', None, "JSON object"),
        (json.dumps({**GOOD, "hash_ids": "1,2"}), "hash_ids", "list"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "output_length"}),
         "output_length", "missing"),
        (json.dumps({**GOOD, "input_length": "600"}), "input_length", "integer"),
        (json.dumps({**GOOD, "input_length": 0}), "input_length", ">= 1"),
        (json.dumps({**GOOD, "timestamp": -5}), "timestamp", ">= 0"),
        (json.dumps({**GOOD, "hash_ids": [1, -2]}), "hash_ids", "non-negative"),
        (json.dumps({**GOOD, "hash_ids": [1]}), "hash_ids", "needs ceil(600/512) = 2"),
    ],
)
def test_mooncake_bad_line_names_file_line_key(
    tmp_path: Path, line: str, key: str | None, problem: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(InputFileError) as info:
        load_trace(path)
    exc = info.value
    assert (exc.path, exc.line, exc.key) == (str(path), 3, key)
    assert problem in str(exc) and f"{path}:3" in str(exc)
    wl = load_trace(path, skip_bad_lines=True)
    assert len(wl.requests) == 2 and wl.num_skipped_lines == 1
    assert wl.first_skipped_problem is not None and problem in wl.first_skipped_problem


def test_azure_csv(tmp_path: Path, data: Callable[[str], Path]) -> None:
    wl = load_trace(data("traces/AzureLLMInferenceTrace_conv.csv.gz"), limit=200)
    assert len(wl.requests) == 200 and wl.requests[0].arrival_s == 0.0
    assert wl.requests[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert (wl.requests[0].num_prompt_tokens, wl.requests[0].num_output_tokens) == (374, 44)
    assert run_pure_cache(wl, block_size=16, num_blocks=100_000).hit_rate() == 0.0
    assert infinite_cache_hits(access_sequence(wl, 16)).hit_rate() == 0.0

    bad = tmp_path / "bad.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,lots,109\n"
        "yesterday,10,10\n"
    )
    with pytest.raises(InputFileError) as info:
        load_trace(bad)
    assert (info.value.line, info.value.key) == (3, "ContextTokens")
    wl = load_trace(bad, skip_bad_lines=True)
    assert len(wl.requests) == 1 and wl.num_skipped_lines == 2
    nohead = tmp_path / "nohead.csv"
    nohead.write_text("TIMESTAMP,Context\n")
    with pytest.raises(InputFileError, match="ContextTokens"):
        load_trace(nohead)
