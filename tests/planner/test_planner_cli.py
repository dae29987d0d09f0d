"""``pagedkv plan``: JSON figures, tables (rich and plain), and exit codes."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

GiB = 1 << 30
RunPlan = Callable[..., tuple[int, str, str]]  # the run_plan fixture of conftest.py


def plan_json(run_plan: RunPlan, *argv: str) -> dict[str, Any]:
    code, out, err = run_plan(*argv, "--json")
    assert (code, err) == (0, "")
    report: dict[str, Any] = json.loads(out)
    return report


def test_json_with_kv_cache_memory(run_plan: RunPlan) -> None:
    report = plan_json(run_plan, "llama-3.1-8b", "--kv-cache-memory", "10GiB",
                       "--max-model-len", "8192")
    plan = report["plans"]["hybrid_on"]
    assert plan["num_blocks"] == 5120 and plan["kv_tokens"] == 5119 * 16
    assert plan["blocks_per_request"] == 512 and len(plan["tensors"]) == 32
    assert report["memory"] == {"kv_cache_bytes": 10 * GiB}
    assert report["model"]["bytes_per_token"] == 131_072


def test_gpu_memory_estimates_weights(run_plan: RunPlan) -> None:
    report = plan_json(run_plan, "Llama-3.1-8B", "--gpu-memory", "80GiB",
                       "--max-model-len", "8192")
    memory = report["memory"]
    weights = 2 * 8_029_995_008
    assert memory == {  # 80 GiB x 0.9 - weights - 2 GiB activations
        "kv_cache_bytes": 77_309_411_328 - weights - 2 * GiB,
        "gpu_memory_bytes": 80 * GiB, "gpu_memory_utilization": 0.9,
        "num_parameters": 8_029_995_008, "weight_dtype": "bf16",
        "weight_bytes_per_rank": weights, "activation_reserve_bytes": 2 * GiB,
    }
    plan = report["plans"]["hybrid_on"]
    assert plan["num_blocks"] == (77_309_411_328 - weights - 2 * GiB) // (65_536 * 32)


def test_flags_reach_the_plan(run_plan: RunPlan) -> None:
    report = plan_json(run_plan, "Llama-3.1-70B", "--kv-cache-memory", "20GB", "--tp", "4",
                       "--kv-dtype", "fp8", "--block-size", "32", "--max-model-len", "4096",
                       "--num-blocks", "4000")
    plan = report["plans"]["hybrid_on"]
    assert report["model"]["bytes_per_token"] == 80 * 2 * 2 * 128
    assert plan["block_size"] == 32 and plan["num_blocks"] == 4000
    assert plan["page_size_bytes"] == 2 * 32 * 2 * 128


def test_compare_hybrid(run_plan: RunPlan) -> None:
    report = plan_json(run_plan, "Gemma-3-27B-it", "--kv-cache-memory", "20GiB",
                       "--max-model-len", "32768", "--compare-hybrid")
    plans = report["plans"]
    on, off = plans["hybrid_on"], plans["hybrid_off"]
    assert (len(on["groups"]), len(off["groups"])) == (7, 1)
    assert on["num_padding_layers"] == 8
    assert on["max_concurrency"] > 1.4 * off["max_concurrency"]  # async: 2 steps in flight
    sync = plan_json(run_plan, "Gemma-3-27B-it", "--kv-cache-memory", "20GiB",
                     "--max-model-len", "32768", "--compare-hybrid", "--no-async-scheduling")
    assert sync["plans"]["hybrid_on"]["max_concurrency"] > \
        2 * sync["plans"]["hybrid_off"]["max_concurrency"]


def test_no_hybrid(run_plan: RunPlan) -> None:
    report = plan_json(run_plan, "Mistral-7B-v0.1", "--kv-cache-memory", "10GiB",
                       "--no-hybrid")
    assert list(report["plans"]) == ["hybrid_off"]


def test_layer_file_model(run_plan: RunPlan, tmp_path: Path) -> None:
    path = tmp_path / "toy.json"
    path.write_text(json.dumps({"max_position_embeddings": 1024, "layers": [
        {"kind": "full_attention", "count": 4, "num_kv_heads": 1, "head_size": 64,
         "dtype_bytes": 2}]}))
    report = plan_json(run_plan, str(path), "--kv-cache-memory", "2MiB")
    plan = report["plans"]["hybrid_on"]
    assert plan["num_blocks"] == (2 << 20) // (4096 * 4)
    code, _, err = run_plan(str(path), "--gpu-memory", "80GB")
    assert code == 1 and "gives no num_parameters" in err


@pytest.mark.parametrize("rich_available", [True, False])
def test_tables(run_plan: RunPlan, monkeypatch: pytest.MonkeyPatch,
                rich_available: bool) -> None:
    if not rich_available:
        for module in ("rich", "rich.console", "rich.table"):
            monkeypatch.setitem(sys.modules, module, None)  # import -> ImportError
    else:
        pytest.importorskip("rich")
    code, out, err = run_plan("AI21-Jamba-1.5-Mini", "--kv-cache-memory", "10GiB",
                              "--max-model-len", "32768")
    assert (code, err) == (0, "")
    for text in ("Model", "Groups", "Layer -> group -> tensor", "80 tokens (page 327,680 B)",
                 "8 x 4", "8,192", "state page +16,384 B (5.26 %)", "layers.31",
                 "grown from 16 to 80"):
        assert text in out
    if not rich_available:
        assert re.search(r"\n  num_blocks +8,192\n", out)


def test_brief_omits_layer_table(run_plan: RunPlan) -> None:
    code, out, _ = run_plan("Qwen3-32B", "--kv-cache-memory", "20GiB", "--brief")
    assert code == 0 and "Layer -> group -> tensor" not in out and "Groups" in out


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["Llama-3.1-8B", "--kv-cache-memory=-5GB"], 2,
     "argument --kv-cache-memory: the size must not be negative, got '-5GB'"),
    (["Llama-3.1-8B", "--gpu-memory", "lots"], 2, "the size 'lots' is not a size"),
    (["Llama-3.1-8B", "--gpu-memory", "80"], 2, "did you mean 80GiB?"),
    (["Llama-3.1-70B", "--kv-cache-memory", "10GB", "--tp", "3"], 1,
     "tensor-parallel size 3 does not divide num_attention_heads = 64"),
    (["Llama-3.1-8B", "--kv-cache-memory", "10GB", "--tp", "0"], 2,
     "argument --tp: must be a whole number >= 1, got '0'"),
    (["Llama-3.1-70B", "--kv-cache-memory", "1GiB", "--max-model-len", "131072"], 1,
     "the largest max_model_len that fits is 3,248"),
    (["Llama-3.1-70B", "--gpu-memory", "80GB"], 1, "exceed the usable"),
    (["no-such-model", "--kv-cache-memory", "1GB"], 1, "no such file and no bundled config"),
    (["Llama-3.1-8B", "--gpu", "h1000"], 2, "did you mean 'H100-SXM'"),
])
def test_refusals_are_one_line_with_the_rule_s_exit_code(
        capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str) -> None:
    """2: the caller's mistake (a usage line naming ``pagedkv plan --help``); 1: the plan
    cannot be made."""
    from pagedkv.cli import main

    try:
        got = main(["plan", *argv])
    except SystemExit as exc:
        got = exc.code if isinstance(exc.code, int) else -1
    out, err = capsys.readouterr()
    assert got == code and out == "", err
    assert err.startswith("pagedkv plan: error: ") and message in err, err
    assert err.count("\n") == 1


def test_a_context_that_does_not_fit_is_capped_with_a_note(run_plan: RunPlan) -> None:
    """A bundled model at its defaults plans (exit 0) at the longest context that fits,
    and says so and what to change; an explicit --max-model-len is not capped."""
    code, out, err = run_plan("Llama-3.1-70B", "--kv-cache-memory", "1GiB", "--brief")
    assert (code, err) == (0, "")
    assert out.startswith("max_model_len: 3,248, capped: the model's full 131,072 tokens "
                          "do not fit") and "--max-model-len N" in out
    report = plan_json(run_plan, "Llama-3.1-70B", "--kv-cache-memory", "1GiB")
    assert report["plans"]["hybrid_on"]["max_model_len"] == 3248
    assert report["notes"][0].startswith("max_model_len: 3,248, capped")


def test_bad_config_file_exits_1(run_plan: RunPlan, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    code, _, err = run_plan(str(path), "--kv-cache-memory", "1GB")
    assert code == 1
    assert f"{path}: key 'num_attention_heads': missing" in err


def test_no_memory_flag_assumes_the_gpus_memory(run_plan: RunPlan) -> None:
    # README: `pagedkv plan MODEL` answers; the memory is one GPU's of --gpu, said first.
    code, out, err = run_plan("Llama-3.1-8B", "--brief")
    assert (code, err) == (0, "")
    assert out.startswith("GPU memory: 80GiB, the H100-SXM's (no --gpu-memory")
    assert plan_json(run_plan, "Llama-3.1-8B") == plan_json(run_plan, "Llama-3.1-8B",
                                                            "--gpu-memory", "80GiB")
    h200 = plan_json(run_plan, "Llama-3.1-8B", "--gpu", "h200")
    assert h200["memory"]["gpu_memory_bytes"] == 141 * GiB


@pytest.mark.parametrize("argv", [
    ["Llama-3.1-8B", "--gpu-memory", "80GB", "--kv-cache-memory", "10GB"],
    ["Llama-3.1-8B", "--kv-cache-memory", "10GB", "--tp", "two"],
    ["Llama-3.1-8B", "--kv-cache-memory", "10GB", "--no-hybrid", "--compare-hybrid"],
    ["Llama-3.1-8B", "--kv-cache-memory", "10GB", "--kv-dtype", "int3"],
])
def test_usage_errors_exit_2(run_plan: RunPlan, argv: list[str],
                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run_plan(*argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagedkv plan: error: ") and err.count("\n") == 1
    assert "'pagedkv plan --help'" in err


def test_compare_shows_an_unchanged_layout_once(run_plan: RunPlan) -> None:
    code, out, _ = run_plan("Mistral-7B-v0.1", "--kv-cache-memory", "10GiB",
                            "--max-model-len", "32768", "--compare-hybrid", "--brief")
    assert code == 0 and out.count("Groups (hybrid on = hybrid off)") == 1
    # vLLM refuses a Mamba hybrid with the hybrid allocator off
    code, out, err = run_plan("AI21-Jamba-1.5-Mini", "--kv-cache-memory", "10GiB",
                              "--max-model-len", "32768", "--compare-hybrid", "--brief")
    assert code == 1 and "cannot be promoted to one KV-cache type" in err
    code, out, _ = run_plan("Gemma-3-27B-it", "--kv-cache-memory", "20GiB",
                            "--max-model-len", "32768", "--compare-hybrid", "--brief")
    assert "Groups (hybrid on)" in out and "Groups (hybrid off)" in out
    assert "hybrid off: sliding-window and chunked layers costed as full attention" in out


@pytest.mark.parametrize(("gpu", "name", "family", "batched", "backend"), [
    ("h100", "H100-SXM", "hopper", 8192, "FLASH_ATTN"),
    ("HOPPER", "H100-SXM", "hopper", 8192, "FLASH_ATTN"),
    ("H200", "H200", "hopper", 8192, "FLASH_ATTN"),
    ("a100", "A100-80GB", "ampere", 2048, "FLASH_ATTN"),
    ("b200", "B200", "blackwell", 16384, "FLASHINFER"),
    ("L40S", "L40S", "ada", 2048, "FLASH_ATTN"),
    ("mi300x", "MI300X", "cdna3", 16384, "ROCM_ATTN"),
])
def test_every_name_of_the_gpu_table_plans(run_plan: RunPlan, gpu: str, name: str,
                                           family: str, batched: int, backend: str) -> None:
    """``plan --gpu`` takes the names ``simulate --gpu`` takes (one table, any case): the
    memory, family, backend and vLLM's serving batch default follow the card."""
    from pagedkv.planner.gpus import GPUS

    report = plan_json(run_plan, "Llama-3.1-8B", "--gpu", gpu)
    assert report["memory"]["gpu_memory_bytes"] == int(GPUS[name].memory_gib * GiB)
    assumed = report["assumptions"]
    assert assumed["gpu_family"] == family and assumed["attention_backend"] == backend
    assert assumed["max_num_batched_tokens"] == batched
