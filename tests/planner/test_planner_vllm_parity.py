"""pagedkv's plans against vLLM 0.33's own planner, case by case.

The expected values in ``vllm_expected.json`` were computed by vLLM 0.33.0's planning
functions (grouping, num_blocks, memory check, capacity, block-size alignment, Mamba state
shapes and dtypes), driven by ``conformance/planner_expected.py``. Regenerate with::

    VLLM_PYTHON conformance/planner_expected.py --out tests/planner/vllm_expected.json

(``VLLM_PYTHON``: a Python with vLLM 0.33.0 and transformers.) Every bundled config x TP
1/2/4/8 (where TP divides the heads) x KV dtype auto/fp8 x 16/48 GiB x (defaults, prefix
caching off, async scheduling off), Hopper, max_model_len 32,768, plus hybrid-off cases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pagedkv.core.specs import MambaSpec
from pagedkv.errors import ConfigError, InsufficientMemoryError
from pagedkv.planner import plan_model

_HERE = Path(__file__).parent
_TABLE = json.loads((_HERE / "vllm_expected.json").read_text())
BUNDLED_CASES: list[dict[str, Any]] = _TABLE["cases"]
#: Held-back families (Qwen3-Next, Nemotron-H, gpt-oss) on configs CONSTRUCTED from their
#: documented schemas (constructed_configs/, labelled inside), planned by the same script:
#: VLLM_PYTHON conformance/planner_expected.py --constructed \
#:     --configs tests/planner/constructed_configs \
#:     --out tests/planner/vllm_expected_constructed.json
CONSTRUCTED_CASES: list[dict[str, Any]] = json.loads(
    (_HERE / "vllm_expected_constructed.json").read_text())["cases"]
CASES = BUNDLED_CASES + CONSTRUCTED_CASES

_KIND = {"FullAttentionSpec": "full_attention", "SlidingWindowSpec": "sliding_window",
         "ChunkedLocalAttentionSpec": "chunked_local_attention",
         "MLAAttentionSpec": "mla_attention", "MambaSpec": "mamba"}


def _case_id(case: dict[str, Any]) -> str:
    hybrid = "" if case["hybrid"] else "-hybrid-off"
    return (f"{case['model']}-tp{case['tp']}-{case['kv_dtype']}-{case['memory_gib']}GiB-"
            f"{case['mode']}{hybrid}")


def _model_arg(case: dict[str, Any]) -> str:
    if case in CONSTRUCTED_CASES:
        return str(_HERE / "constructed_configs" / f"{case['model']}.json")
    return str(case["model"])


def test_table_covers_every_bundled_config_and_mode() -> None:
    models = {c["model"] for c in BUNDLED_CASES}
    assert len(models) == 9 and len(CASES) >= 9 * 2 * 2 * 3
    assert {c["mode"] for c in CASES} == {"defaults", "no_prefix_caching", "no_async"}


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_matches_vllm(case: dict[str, Any]) -> None:
    kwargs: dict[str, Any] = dict(
        kv_cache_bytes=case["memory_gib"] << 30, tp_size=case["tp"], kv_dtype=case["kv_dtype"],
        max_model_len=case["max_model_len"],
        max_num_batched_tokens=case["max_num_batched_tokens"], gpu="h100",
        prefix_caching=case["mode"] != "no_prefix_caching",
        async_scheduling=case["mode"] != "no_async",
        hybrid="on" if case["hybrid"] else "off",
    )
    if "error" in case:
        with pytest.raises((ConfigError, InsufficientMemoryError)):
            plan_model(_model_arg(case), **kwargs)
        return
    result = plan_model(_model_arg(case), **kwargs)
    plan = result.plan
    assert result.backend.name == case["backend"]
    assert plan.block_size == case["block_size"]
    assert plan.page_size_bytes == case["page_size_bytes"]
    assert plan.num_blocks == case["num_blocks"]
    assert [(g.spec.kind, list(g.layer_names)) for g in plan.groups] == [
        (_KIND[g["kind"]], g["layers"]) for g in case["groups"]]
    assert plan.blocks_per_request == case["blocks_per_request"]
    assert plan.max_concurrency == pytest.approx(case["max_concurrency"], rel=1e-12)
    assert plan.kv_cache_size_tokens == case["kv_cache_size_tokens"]
    assert plan.vllm_log_line == case["log_line"]
    unification = plan.page_unification
    if case["mamba_padding_pct"] is None:
        assert unification is None or unification.state_padding_bytes == 0
    else:
        assert unification is not None
        assert round(unification.state_padding_pct, 4) == case["mamba_padding_pct"]
    assert all(isinstance(g.spec, MambaSpec) == (g.spec.kind == "mamba") for g in plan.groups)


def test_published_qwen3_next_log() -> None:
    """The published vLLM log for Qwen3-Next-80B-A3B (TP 2, bf16, 44.59 GiB for KV,
    max_model_len 262,144): prefix caching off 544 / 7,162 blocks / 1.49 % / 14.77x; at
    0.33's defaults on an H100 576 / 6,764 / 465 blocks per request / 7.46 % / 14.55x.
    Constructed config (documented schema, published sizes)."""
    model = str(_HERE / "constructed_configs" / "Qwen3-Next-80B-A3B-constructed.json")
    kv_bytes = 7162 * 544 * 1024 * 12 + 4096  # what "44.59 GiB" stands for
    common: dict[str, Any] = dict(kv_cache_bytes=kv_bytes, tp_size=2, gpu="h100")
    off = plan_model(model, prefix_caching=False, **common).plan
    assert (off.block_size, off.num_blocks) == (544, 7162)
    assert off.page_unification is not None
    assert f"{off.page_unification.state_padding_pct:.2f}" == "1.49"
    assert f"{off.max_concurrency:.2f}" == "14.77"
    on = plan_model(model, **common).plan
    assert (on.block_size, on.num_blocks, on.blocks_per_request) == (576, 6764, 465)
    assert on.page_unification is not None
    assert f"{on.page_unification.state_padding_pct:.2f}" == "7.46"
    assert f"{on.max_concurrency:.2f}" == "14.55"
