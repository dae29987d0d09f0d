"""The side-by-side harness (``benchmarks/kv_workload.py``) and its pagedkv adapter: the
workloads are deterministic, a gzip'd trace reads like the plain one, a bad trace line is
named, and replaying a workload twice on fresh managers gives the same block ids. (The
speed figures come from ``benchmarks/compare_vllm.py``; nothing here is timed.)"""

from __future__ import annotations

import argparse
import doctest
import gzip
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import kv_workload  # noqa: E402
from vllm_compare_adapter import PagedKVAdapter  # noqa: E402


def _args(*flags: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    kv_workload.add_workload_args(ap)
    return kv_workload.parse_with_preset(ap, list(flags))


def test_synthetic_workload_is_deterministic_and_shares_its_prompt() -> None:
    a = kv_workload.build_workload(_args("--num-requests", "40"))
    b = kv_workload.build_workload(_args("--num-requests", "40"))
    assert kv_workload.workload_digest(a) == kv_workload.workload_digest(b)
    assert all(r.prompt[:1024] == a[0].prompt[:1024] for r in a)  # shared fraction 1.0
    other = kv_workload.build_workload(_args("--num-requests", "40", "--seed", "1"))
    assert kv_workload.workload_digest(other) != kv_workload.workload_digest(a)


def test_preset_expands_and_explicit_flags_win() -> None:
    args = _args("--preset", "heavy-eviction", "--num-blocks", "900")
    assert (args.num_blocks, args.num_system_prompts, args.shared_fraction) == (900, 8, 0.8)
    assert _args("--preset", "mooncake").trace == kv_workload.DEFAULT_TRACE


def test_bundled_trace_plain_and_gzip_give_one_workload(tmp_path: Path) -> None:
    plain = kv_workload.build_workload(_args("--preset", "mooncake", "--trace-limit", "30"))
    assert len(plain) == 30
    packed = tmp_path / "trace.jsonl.gz"
    packed.write_bytes(gzip.compress(Path(kv_workload.DEFAULT_TRACE).read_bytes()))
    again = kv_workload.build_workload(_args("--preset", "mooncake", "--trace", str(packed),
                                             "--trace-limit", "30"))
    assert kv_workload.workload_digest(again) == kv_workload.workload_digest(plain)


def test_bad_trace_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"input_length": 4, "hash_ids": [1]}\n{"input_length": "x"}\n')
    with pytest.raises(SystemExit, match=r"t\.jsonl:2: not a Mooncake record"):
        kv_workload.build_workload(_args("--trace", str(bad)))


def _run(*flags: str) -> dict[str, Any]:
    args = _args(*flags)
    reqs = kv_workload.build_workload(args)
    args.max_model_len = max(len(r.prompt) + len(r.decode) for r in reqs)
    return kv_workload.replay(PagedKVAdapter(args), reqs, args.concurrency)


def test_replay_on_fresh_managers_gives_the_same_block_ids() -> None:
    flags = ("--preset", "heavy-eviction", "--num-requests", "120", "--num-blocks", "300")
    first, second = _run(*flags), _run(*flags)
    assert first["digest_lookup"] == second["digest_lookup"]
    assert first["digest_alloc"] == second["digest_alloc"]
    assert first["hit_tokens"] > 0 and first["ops"]["free"]["count"] == 120
    assert first["final_free_blocks"] == 299  # everything freed (block 0 is the null block)


def test_repeats_rate_each_calls_fastest_replay() -> None:
    """``--repeat 3``: the best-of-replays rate is at least every replay's own rate (each
    call's best time is at most its time in any replay), and the replays' calls line up."""
    args = _args("--preset", "heavy-eviction", "--num-requests", "60", "--num-blocks", "300",
                 "--repeat", "3")
    out = kv_workload.run_cli(PagedKVAdapter, args, {})
    assert "call_ns" not in out and len(out["repeats_core_ops_per_s"]) == 3
    assert out["best_core_ops_per_s"] >= max(out["repeats_core_ops_per_s"]) * 0.999
    assert (out["best_core_plus_hash_ops_per_s"]
            >= max(out["repeats_core_plus_hash_ops_per_s"]) * 0.999)


def test_best_of_replays_refuses_replays_that_differ() -> None:
    with pytest.raises(ValueError, match="different calls"):
        kv_workload.best_call_ns([{"free": [1, 2]}, {"free": [1]}])


@pytest.mark.parametrize("preset", ["shared-prompt", "heavy-eviction", "new-requests"])
def test_both_cores_give_the_same_block_ids(preset: str) -> None:
    """The harness's digests (every hit length, hit block id and new block id) on the
    compiled core and on the pure one, in one process; without the compiled core both
    sides are pure and the test still checks determinism."""
    from pagedkv.core import native

    flags = ("--preset", preset, "--num-requests", "150", "--hash-algo", "sha256_cbor")
    compiled = _run(*flags)
    with native.forced_pure():
        pure = _run(*flags)
    assert compiled["digest_lookup"] == pure["digest_lookup"]
    assert compiled["digest_alloc"] == pure["digest_alloc"]
    assert compiled["final_free_blocks"] == pure["final_free_blocks"]
    assert compiled["ops"]["allocate_decode"]["count"] > 1000  # the per-step path ran


@pytest.mark.parametrize("name", ["kv_workload", "conformance.codec", "conformance.transcript"])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
