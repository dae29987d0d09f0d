"""Weights estimate: exact parameter counts derived by hand, published totals within 1 %,
MoE experts counted, TP division, and the memory budget."""

from __future__ import annotations

import pytest
from planner_configs import DEEPSEEK_V2_LITE, MIXTRAL_8X7B, NEMOTRON_H_8B, QWEN3_NEXT_80B

from pagedkv.errors import InvalidArgumentError
from pagedkv.planner import (
    estimate_num_parameters,
    estimate_weights,
    kv_cache_budget,
    load_config,
)

GiB = 1 << 30


def params(name: str) -> int:
    config, source, _ = load_config(name)
    return estimate_num_parameters(config, source=source)


def test_llama_3_1_8b_exact() -> None:
    embeddings = 2 * 128_256 * 4096  # input table and untied head
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024  # q, o; k, v (8 KV heads of 128)
    mlp = 3 * 4096 * 14_336
    assert params("Llama-3.1-8B") == embeddings + 32 * (attention + mlp) == 8_029_995_008


def test_mixtral_counts_every_expert() -> None:
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024
    moe = 8 * 3 * 4096 * 14_336 + 4096 * 8  # experts and router
    expected = 2 * 32_000 * 4096 + 32 * (attention + moe)
    assert estimate_num_parameters(MIXTRAL_8X7B) == expected == 46_702_526_464


@pytest.mark.parametrize(("name", "published"), [
    ("Llama-3.1-8B", 8.03e9), ("Llama-3.1-70B", 70.55e9), ("Qwen3-32B", 32.8e9),
    ("Qwen2.5-7B-Instruct", 7.61e9), ("Mistral-7B-v0.1", 7.24e9), ("DeepSeek-V3", 671e9),
    ("AI21-Jamba-1.5-Mini", 51.6e9), ("Gemma-3-27B-it", 27.0e9),
    ("Llama-4-Scout-17B-16E-Instruct", 108e9),  # 109 B with the vision tower
])
def test_bundled_counts_match_published_totals(name: str, published: float) -> None:
    assert params(name) == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize(("config", "published"), [
    (DEEPSEEK_V2_LITE, 15.7e9), (QWEN3_NEXT_80B, 80e9), (NEMOTRON_H_8B, 8.1e9),
])
def test_synthetic_counts_match_published_totals(config: dict[str, object],
                                                 published: float) -> None:
    assert estimate_num_parameters(config) == pytest.approx(published, rel=0.03)


def test_weight_dtype_and_tp() -> None:
    config, _, _ = load_config("DeepSeek-V3")
    auto = estimate_weights(config, tp_size=8)
    assert auto.weight_dtype == "fp8"  # from quantization_config
    assert auto.weight_bytes == auto.num_parameters
    assert auto.weight_bytes_per_rank == -(-auto.num_parameters // 8)
    bf16 = estimate_weights(config, tp_size=8, weight_dtype="bf16")
    assert bf16.weight_bytes == 2 * auto.num_parameters
    int4 = estimate_weights(load_config("Llama-3.1-8B")[0], weight_dtype="int4")
    assert int4.weight_bytes == 8_029_995_008 // 2
    with pytest.raises(InvalidArgumentError, match="weight_dtype"):
        estimate_weights(config, weight_dtype="fp6")


def test_budget() -> None:
    budget = kv_cache_budget(gpu_memory_bytes=80 * GiB, utilization=0.9,
                             weight_bytes=16_059_990_016, activation_reserve_bytes=2 * GiB)
    assert budget.usable_bytes == 77_309_411_328
    assert budget.kv_cache_bytes == 77_309_411_328 - 16_059_990_016 - 2 * GiB


@pytest.mark.parametrize(("gpu", "utilization", "reserve"), [
    (-1, 0.9, 0), (0, 0.9, 0), (GiB, 0.0, 0), (GiB, 1.5, 0), (GiB, 0.9, -1)])
def test_budget_rejects_bad_inputs(gpu: int, utilization: float, reserve: int) -> None:
    with pytest.raises(InvalidArgumentError):
        kv_cache_budget(gpu_memory_bytes=gpu, utilization=utilization, weight_bytes=0,
                        activation_reserve_bytes=reserve)
