"""config.json -> per-layer specs: bundled configs, synthetic family configs, TP, dtypes, and
the errors for configs that are not understood."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from planner_configs import (
    DEEPSEEK_V2_LITE,
    GEMMA2_9B,
    GPT_OSS_20B,
    NEMOTRON_H_8B,
    QWEN3_NEXT_80B,
)

from pagedkv.core.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.errors import ConfigError, InputFileError, UnsupportedModelError
from pagedkv.planner import (
    ModelSpec,
    bundled_model_names,
    load_config,
    load_model_spec,
    model_spec_from_config,
)


def bundled(name: str) -> dict[str, Any]:
    return load_config(name)[0]


def indices(model: ModelSpec, spec_type: type) -> list[int]:
    return [int(name.split(".")[1]) for name, spec in model.layer_specs
            if type(spec) is spec_type]


def test_bundled_names() -> None:
    assert bundled_model_names() == [
        "AI21-Jamba-1.5-Mini", "DeepSeek-V3", "Gemma-3-27B-it", "Llama-3.1-70B",
        "Llama-3.1-8B", "Llama-4-Scout-17B-16E-Instruct", "Mistral-7B-v0.1",
        "Mixtral-8x7B-Instruct-v0.1", "Qwen2.5-7B-Instruct", "Qwen3-235B-A22B-Instruct-2507",
        "Qwen3-32B", "Qwen3-8B",
    ]


@pytest.mark.parametrize("query", ["Llama-3.1-8B", "llama-3.1-8b", "LLAMA-3.1-8B.json"])
def test_bundled_name_is_case_insensitive(query: str) -> None:
    assert load_config(query)[2] == "Llama-3.1-8B"


def test_bundled_name_by_unique_part() -> None:
    assert load_config("scout")[2] == "Llama-4-Scout-17B-16E-Instruct"
    with pytest.raises(ConfigError, match=r"Llama-3\.1-70B, Llama-3\.1-8B"):
        load_config("Llama-3.1")


def test_unknown_name_lists_bundled() -> None:
    with pytest.raises(InputFileError, match=r"bundled configs: AI21-Jamba-1\.5-Mini"):
        load_config("no-such-model")


def test_config_path_and_bad_json(tmp_path: Path) -> None:
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(bundled("Llama-3.1-8B")))
    assert load_config(str(folder / "config.json"))[2] == "my-llama"
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "model_type": "llama",\n  oops\n}')
    with pytest.raises(InputFileError, match=r"bad\.json:3: not valid JSON"):
        load_config(str(bad))


# -- bundled families with exact figures -------------------------------------------------


def test_llama_3_1_70b_bytes_per_token() -> None:
    model = load_model_spec("Llama-3.1-70B")
    assert model.kind_to_num_layers == {"full_attention": 80}
    assert model.bytes_per_token == 327_680  # 80 x 2 x 8 x 128 x 2
    assert model.max_position_embeddings == 131_072


def test_deepseek_v3_mla_bytes_per_token() -> None:
    model = load_model_spec("DeepSeek-V3")
    assert model.kind_to_num_layers == {"mla_attention": 61}
    spec = model.layer_specs[0][1]
    assert spec == MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype_bytes=2)
    assert model.bytes_per_token == 70_272  # 61 x (512 + 64) x 2
    # MLA keeps its latent whole on every rank.
    assert load_model_spec("DeepSeek-V3", tp_size=8).bytes_per_token == 70_272


def test_gemma_3_27b_pattern() -> None:
    model = load_model_spec("Gemma-3-27B-it")
    assert model.kind_to_num_layers == {"sliding_window": 52, "full_attention": 10}
    assert indices(model, FullAttentionSpec) == list(range(5, 62, 6))
    windows = {s.sliding_window for _, s in model.layer_specs if isinstance(s, SlidingWindowSpec)}
    assert windows == {1024}
    assert "text_config.sliding_window_pattern absent: using 6" in model.notes


def test_llama_4_scout_chunked_and_nope_layers() -> None:
    model = load_model_spec("Llama-4-Scout-17B-16E-Instruct")
    assert model.kind_to_num_layers == {"chunked_local_attention": 36, "full_attention": 12}
    assert indices(model, FullAttentionSpec) == list(range(3, 48, 4))
    chunks = {s.attention_chunk_size for _, s in model.layer_specs
              if isinstance(s, ChunkedLocalAttentionSpec)}
    assert chunks == {8192}


def test_qwen2_5_with_sliding_window_off_is_full_attention() -> None:
    config = bundled("Qwen2.5-7B-Instruct")
    assert config["use_sliding_window"] is False and config["sliding_window"] == 131072
    model = model_spec_from_config(config)
    assert model.kind_to_num_layers == {"full_attention": 28}
    assert model.bytes_per_token == 28 * 2 * 4 * 128 * 2


def test_qwen2_with_sliding_window_on_windows_the_upper_layers() -> None:
    config = {**bundled("Qwen2.5-7B-Instruct"), "use_sliding_window": True,
              "sliding_window": 4096, "max_window_layers": 20}
    model = model_spec_from_config(config)
    assert indices(model, SlidingWindowSpec) == list(range(20, 28))
    assert indices(model, FullAttentionSpec) == list(range(20))


def test_qwen3_32b() -> None:
    model = load_model_spec("Qwen3-32B")
    assert model.kind_to_num_layers == {"full_attention": 64}
    assert model.bytes_per_token == 64 * 2 * 8 * 128 * 2


def test_mistral_7b_all_sliding() -> None:
    model = load_model_spec("Mistral-7B-v0.1")
    assert model.kind_to_num_layers == {"sliding_window": 32}
    assert {s.sliding_window for _, s in model.layer_specs} == {4096}  # type: ignore[attr-defined]


def test_jamba_1_5_mini() -> None:
    model = load_model_spec("AI21-Jamba-1.5-Mini")
    assert model.kind_to_num_layers == {"mamba": 28, "full_attention": 4}
    assert indices(model, FullAttentionSpec) == [4, 12, 20, 28]
    states = {s.state_bytes for _, s in model.layer_specs if isinstance(s, MambaSpec)}
    assert states == {311_296}  # 8192 x (3 + 16) x 2
    # TP 2 halves the channels the state is kept for.
    tp2 = load_model_spec("AI21-Jamba-1.5-Mini", tp_size=2)
    assert {s.state_bytes for _, s in tp2.layer_specs if isinstance(s, MambaSpec)} == {155_648}


# -- synthetic configs of the other families -----------------------------------------------


def test_gemma2_even_layers_slide() -> None:
    model = model_spec_from_config(GEMMA2_9B)
    assert indices(model, SlidingWindowSpec) == list(range(0, 42, 2))
    assert indices(model, FullAttentionSpec) == list(range(1, 42, 2))
    assert model.bytes_per_token == 42 * 2 * 8 * 256 * 2


def test_gpt_oss_layer_types() -> None:
    model = model_spec_from_config(GPT_OSS_20B)
    assert model.kind_to_num_layers == {"sliding_window": 12, "full_attention": 12}
    first = model.layer_specs[0][1]
    assert first == SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=64,
                                      dtype_bytes=2, sliding_window=128)


def test_deepseek_v2_lite() -> None:
    model = model_spec_from_config(DEEPSEEK_V2_LITE)
    assert model.kind_to_num_layers == {"mla_attention": 27}
    assert model.bytes_per_token == 27 * 576 * 2


def test_qwen3_next_gated_delta_net() -> None:
    model = model_spec_from_config(QWEN3_NEXT_80B)
    assert model.kind_to_num_layers == {"mamba": 36, "full_attention": 12}
    assert indices(model, FullAttentionSpec) == list(range(3, 48, 4))
    # conv (2 x 16 x 128 + 32 x 128) x 3 + state 32 x 128 x 128, bf16
    states = {s.state_bytes for _, s in model.layer_specs if isinstance(s, MambaSpec)}
    assert states == {(8192 * 3 + 32 * 128 * 128) * 2} == {1_097_728}
    tp2 = model_spec_from_config(QWEN3_NEXT_80B, tp_size=2)
    assert {s.state_bytes for _, s in tp2.layer_specs if isinstance(s, MambaSpec)} == {548_864}
    assert tp2.layer_specs[3][1] == FullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=256, dtype_bytes=2)


def test_nemotron_h_pattern() -> None:
    model = model_spec_from_config(NEMOTRON_H_8B)
    assert model.num_hidden_layers == 52
    assert model.kind_to_num_layers == {"mamba": 24, "full_attention": 4}
    pattern = NEMOTRON_H_8B["hybrid_override_pattern"]
    assert indices(model, FullAttentionSpec) == [i for i, c in enumerate(pattern) if c == "*"]
    # conv (8192 + 2 x 8 x 128) x 3 in bf16 + SSM 128 x 64 x 128 in float32 (vLLM's
    # default SSM state dtype for Nemotron-H)
    states = {s.state_bytes for _, s in model.layer_specs if isinstance(s, MambaSpec)}
    assert states == {(8192 + 2048) * 3 * 2 + 128 * 64 * 128 * 4} == {4_255_744}
    assert model.mamba_mixer == "mamba2"
    assert model.state_dtypes == ("bfloat16", "float32")
    bf16 = model_spec_from_config(NEMOTRON_H_8B, mamba_ssm_cache_dtype="bfloat16")
    states = {s.state_bytes for _, s in bf16.layer_specs if isinstance(s, MambaSpec)}
    assert states == {((8192 + 2048) * 3 + 128 * 64 * 128) * 2} == {2_158_592}
    tp2 = model_spec_from_config(NEMOTRON_H_8B, tp_size=2, mamba_ssm_cache_dtype="bfloat16")
    assert {s.state_bytes for _, s in tp2.layer_specs if isinstance(s, MambaSpec)} == {1_079_296}
    config_dtype = model_spec_from_config({**NEMOTRON_H_8B, "mamba_ssm_cache_dtype": "bfloat16"})
    assert config_dtype.state_dtypes == ("bfloat16", "bfloat16")


# -- tensor parallelism and dtypes ---------------------------------------------------------


@pytest.mark.parametrize(("tp", "bytes_per_token"), [
    (1, 327_680), (2, 163_840), (4, 81_920), (8, 40_960),
    (16, 40_960),  # fewer KV heads than ranks: one head per rank, replicated
])
def test_tp_splits_kv_heads_not_below_one(tp: int, bytes_per_token: int) -> None:
    assert load_model_spec("Llama-3.1-70B", tp_size=tp).bytes_per_token == bytes_per_token


def test_tp_not_dividing_heads() -> None:
    with pytest.raises(ConfigError, match="tensor-parallel size 3 does not divide "
                       "num_attention_heads = 64"):
        load_model_spec("Llama-3.1-70B", tp_size=3)
    with pytest.raises(ConfigError, match="does not divide num_attention_heads = 28"):
        load_model_spec("Qwen2.5-7B-Instruct", tp_size=8)


def test_tp_neither_divisor_nor_multiple_of_kv_heads() -> None:
    config = {**bundled("Llama-3.1-8B"), "num_attention_heads": 24, "num_key_value_heads": 8,
              "hidden_size": 3072}
    with pytest.raises(ConfigError, match="neither a divisor nor a multiple of "
                       "num_key_value_heads = 8"):
        model_spec_from_config(config, tp_size=12)


def test_tp_not_dividing_mamba_state() -> None:
    with pytest.raises(ConfigError, match="does not divide mamba_num_heads = 128"):
        model_spec_from_config({**NEMOTRON_H_8B, "num_attention_heads": 96,
                                "num_key_value_heads": 3}, tp_size=3)


@pytest.mark.parametrize(("kv_dtype", "bytes_per_token"),
                         [("auto", 327_680), ("bf16", 327_680), ("fp16", 327_680),
                          ("fp8", 163_840)])
def test_kv_dtype(kv_dtype: str, bytes_per_token: int) -> None:
    model = load_model_spec("Llama-3.1-70B", kv_dtype=kv_dtype)
    assert model.bytes_per_token == bytes_per_token


def test_fp8_kv_leaves_mamba_state_in_model_dtype() -> None:
    model = load_model_spec("AI21-Jamba-1.5-Mini", kv_dtype="fp8")
    assert {s.state_bytes for _, s in model.layer_specs if isinstance(s, MambaSpec)} == {311_296}
    assert model.bytes_per_token == 4 * 2 * 8 * 128 * 1


# -- configs that are not understood -------------------------------------------------------


def test_unknown_model_type_names_it_and_missing_fields() -> None:
    config = {"model_type": "wondernet", "hidden_size": 1024, "num_hidden_layers": 4}
    with pytest.raises(UnsupportedModelError) as info:
        model_spec_from_config(config, source="wonder/config.json")
    message = str(info.value)
    assert "unknown model_type 'wondernet'" in message
    assert "fields missing for a generic decoder: num_attention_heads, num_key_value_heads" \
        in message
    assert "wonder/config.json" in message


def test_missing_model_type() -> None:
    with pytest.raises(UnsupportedModelError, match="no model_type"):
        model_spec_from_config({"num_hidden_layers": 2})


def test_missing_field_names_file_and_key() -> None:
    config = bundled("Llama-3.1-8B")
    del config["num_attention_heads"]
    with pytest.raises(InputFileError) as info:
        model_spec_from_config(config, source="llama/config.json")
    assert info.value.key == "num_attention_heads"
    assert str(info.value) == ("llama/config.json: key 'num_attention_heads': missing; "
                               "model_type 'llama' needs an integer here")


@pytest.mark.parametrize(("change", "key", "problem"), [
    ({"num_key_value_heads": 6}, "num_key_value_heads", "6 does not divide"),
    ({"num_hidden_layers": "32"}, "num_hidden_layers", "expected an integer"),
    ({"num_hidden_layers": 0}, "num_hidden_layers", "expected an integer >= 1"),
    ({"hidden_size": 4100}, "hidden_size", "not a multiple of num_attention_heads"),
    ({"torch_dtype": "float8"}, "torch_dtype", "unknown dtype"),
])
def test_contradictory_or_mistyped_fields(change: dict[str, Any], key: str,
                                          problem: str) -> None:
    config = {**bundled("Llama-3.1-8B"), **change}
    with pytest.raises(InputFileError, match=problem) as info:
        model_spec_from_config(config)
    assert info.value.key == key


def test_layer_types_length_contradicts_layer_count() -> None:
    config = {**GPT_OSS_20B, "layer_types": ["full_attention"] * 23}
    with pytest.raises(InputFileError, match="has 23 entries but num_hidden_layers is 24"):
        model_spec_from_config(config)


def test_unknown_layer_type() -> None:
    config = {**GPT_OSS_20B, "layer_types": ["linear_attention"] * 24}
    with pytest.raises(InputFileError, match="entry 0 is 'linear_attention'"):
        model_spec_from_config(config)


def test_nemotron_pattern_length_contradicts_layer_count() -> None:
    config = {**NEMOTRON_H_8B, "num_hidden_layers": 50}
    with pytest.raises(InputFileError, match="52 characters but num_hidden_layers is 50"):
        model_spec_from_config(config)


def test_nested_text_config_error_key() -> None:
    config = copy.deepcopy(bundled("Gemma-3-27B-it"))
    config["text_config"]["num_key_value_heads"] = 5
    with pytest.raises(InputFileError) as info:
        model_spec_from_config(config)
    assert info.value.key == "text_config.num_key_value_heads"


# -- held-back families: documented fields, missing or contradicting ones named ------------


def _pattern_as_block_types(pattern: str) -> list[str]:
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    return [names[c] for c in pattern]


def test_nemotron_h_layers_block_type_reads_like_the_pattern() -> None:
    pattern = NEMOTRON_H_8B["hybrid_override_pattern"]
    listed = {k: v for k, v in NEMOTRON_H_8B.items() if k != "hybrid_override_pattern"}
    listed["layers_block_type"] = _pattern_as_block_types(pattern)
    assert model_spec_from_config(listed) == model_spec_from_config(NEMOTRON_H_8B)


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"hybrid_override_pattern": None}, "hybrid_override_pattern", "layer kinds are unknown"),
    ({"layers_block_type": ["mamba"] * 52}, "hybrid_override_pattern",
     "disagrees with layers_block_type"),
    ({"layers_block_type": ["mamba", "conv"] * 26}, "layers_block_type",
     "unknown layer types"),
    ({"head_dim": 64}, "head_dim", "disagrees with attention_head_dim"),
    ({"mamba_n_groups": 4}, "n_groups", "disagrees with mamba_n_groups"),
    ({"mamba_num_heads": None}, "mamba_num_heads", "missing"),
    ({"ssm_state_size": None}, "ssm_state_size", "missing"),
    ({"mamba_ssm_cache_dtype": "int8"}, "mamba_ssm_cache_dtype", "unknown dtype"),
])
def test_nemotron_h_missing_or_ambiguous_fields_are_named(
        change: dict[str, Any], key: str, words: str) -> None:
    config = {k: v for k, v in {**NEMOTRON_H_8B, **change}.items() if v is not None}
    with pytest.raises(InputFileError) as info:
        model_spec_from_config(config)
    assert info.value.key == key and words in str(info.value)


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"layer_types": ["full_attention"] * 47 + ["mamba"]}, "layer_types", "entry 47"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types", "has 3 entries"),
    ({"linear_num_value_heads": 24, "linear_num_key_heads": 16}, "linear_num_value_heads",
     "not a multiple"),
])
def test_qwen3_next_bad_fields_are_named(change: dict[str, Any], key: str,
                                         words: str) -> None:
    with pytest.raises(InputFileError) as info:
        model_spec_from_config({**QWEN3_NEXT_80B, **change})
    assert info.value.key == key and words in str(info.value)


def test_gpt_oss_layer_types_and_window() -> None:
    config: dict[str, Any] = {
        "model_type": "gpt_oss", "torch_dtype": "bfloat16", "num_hidden_layers": 4,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "hidden_size": 2880, "sliding_window": 128, "max_position_embeddings": 131072,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    model = model_spec_from_config(config)
    assert model.kind_to_num_layers == {"sliding_window": 2, "full_attention": 2}
    with pytest.raises(InputFileError) as info:
        model_spec_from_config({**config, "layer_types": ["sliding_attention"] * 3})
    assert info.value.key == "layer_types"
    with pytest.raises(InputFileError) as info:
        model_spec_from_config({**config, "layer_types": ["local"] * 4})
    assert info.value.key == "layer_types" and "entry 0 is 'local'" in str(info.value)
