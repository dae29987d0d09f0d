"""Synthetic ``config.json`` contents for families without a bundled file, written with the
field names of the real Hugging Face configs (values of the named public checkpoints,
trimmed to what the planner reads)."""

from __future__ import annotations

from typing import Any

# google/gemma-2-9b: 42 layers, even layers sliding (4096), head_dim 256.
GEMMA2_9B: dict[str, Any] = {
    "model_type": "gemma2", "torch_dtype": "bfloat16", "hidden_size": 3584,
    "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "sliding_window": 4096, "vocab_size": 256000,
    "max_position_embeddings": 8192,
}

# openai/gpt-oss-20b: 24 layers alternating sliding (128) / full, 8 KV heads of 64.
GPT_OSS_20B: dict[str, Any] = {
    "model_type": "gpt_oss", "torch_dtype": "bfloat16", "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128, "vocab_size": 201088,
    "num_local_experts": 32, "max_position_embeddings": 131072,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
}

# deepseek-ai/DeepSeek-V2-Lite: 27 MLA layers, kv_lora_rank 512 + rope 64, no q LoRA.
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "model_type": "deepseek_v2", "torch_dtype": "bfloat16", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 64, "n_shared_experts": 2, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "vocab_size": 102400, "max_position_embeddings": 163840,
}

# Qwen/Qwen3-Next-80B-A3B: 48 layers, every 4th full attention, the rest gated delta nets.
QWEN3_NEXT_80B: dict[str, Any] = {
    "model_type": "qwen3_next", "torch_dtype": "bfloat16", "hidden_size": 2048,
    "intermediate_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 512,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1, "vocab_size": 151936, "max_position_embeddings": 262144,
}

# nvidia/Nemotron-H-8B-Base-8K: 52 layers = 24 Mamba-2 (M), 4 attention (*), 24 MLP (-).
NEMOTRON_H_8B: dict[str, Any] = {
    "model_type": "nemotron_h", "torch_dtype": "bfloat16", "hidden_size": 4096,
    "intermediate_size": 21504, "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_attention_heads": 32, "num_key_value_heads": 8, "attention_head_dim": 128,
    "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
    "conv_kernel": 4, "expand": 2, "vocab_size": 131072, "max_position_embeddings": 8192,
}

# mistralai/Mixtral-8x7B-v0.1: 8 experts per layer, no sliding window.
MIXTRAL_8X7B: dict[str, Any] = {
    "model_type": "mixtral", "torch_dtype": "bfloat16", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "sliding_window": None, "vocab_size": 32000, "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}
