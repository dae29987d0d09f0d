"""Expected KV-cache plans, computed by vLLM 0.33's own planning code.

Run with the Python of an environment that has vLLM 0.33.0 (CPU build is enough) and
transformers installed, from the repository root::

    VLLM_PYTHON -m conformance.planner_expected --out tests/planner/vllm_expected.json

(``VLLM_PYTHON`` is that interpreter; ``python conformance/planner_expected.py`` works
too.) It writes the frozen table ``tests/planner/test_planner_vllm_parity.py`` checks
pagedkv against, without needing vLLM at test time.

What is vLLM's and what is this script's:

* The per-layer specs are vLLM's spec classes (``FullAttentionSpec``,
  ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``, ``MLAAttentionSpec``,
  ``MambaSpec``), with state shapes and dtypes from vLLM's
  ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator`` (through the model
  classes' ``get_mamba_state_*_from_config``) and the config parsed by transformers'
  own config classes (so their defaults, e.g. Gemma 3's ``layer_types``, are theirs).
  Which layer gets which spec follows the vLLM model files (read, not imported: the
  model modules need a GPU build); that table is ``_layer_kinds`` below.
* The block size is vLLM's: the attention backend's preferred block size, then
  ``Platform._align_hybrid_block_size`` (called for real, on a stand-in config) for
  Mamba hybrids. The backend is chosen as vLLM's CUDA platform does for Hopper (H100 /
  H200): the priority lists of ``platforms/cuda.py`` (copied as names; that module
  needs ``libcuda``), filtered by each backend class's supported KV dtypes and compute
  capability. ``FLASH_ATTN_MLA`` cannot be imported on a CPU build; its two facts
  (KV dtypes auto/float16/bfloat16, kernel blocks ``MultipleOf(16)``) are stated here.
  The prefill-checkpoint alignment of the Mamba mixers (which the live layers report)
  is stated per mixer: Mamba-1 none, Mamba-2 1, gated delta net 64 with FlashInfer's
  GDN prefill (Hopper default).
* Grouping, num_blocks, the memory check, blocks per request, concurrency and the
  "GPU KV cache size" tokens are vLLM's ``get_kv_cache_groups``,
  ``get_kv_cache_configs``, ``get_kv_cache_capacity`` and the specs'
  ``max_memory_usage_bytes``, called on a stand-in ``VllmConfig`` (only the attributes
  those functions read; ``max_in_flight_tokens`` uses vLLM's own property code).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import torch
import vllm.model_executor.layers.mamba.abstract as mamba_abstract
from transformers import AutoConfig
from vllm.config import CacheConfig, VllmConfig
from vllm.platforms.interface import DeviceCapability, Platform
from vllm.utils.math_utils import cdiv
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.core.kv_cache_planning import get_kv_cache_configs, get_kv_cache_groups
from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    get_kv_quant_mode,
)

logging.disable(logging.WARNING)

HOPPER = DeviceCapability(9, 0)
MAX_MODEL_LEN = 32_768
MAX_NUM_BATCHED_TOKENS = 8192  # vllm serve on an H100/H200 (engine/arg_utils.py)
MEMORY_GIB = (16, 48)
TP_SIZES = (1, 2, 4, 8)
KV_DTYPES = ("auto", "fp8")
MODES = {
    "defaults": {"prefix_caching": True, "async_scheduling": True},
    "no_prefix_caching": {"prefix_caching": False, "async_scheduling": True},
    "no_async": {"prefix_caching": True, "async_scheduling": False},
}
GDN_FLASHINFER_CHECKPOINT_ALIGNMENT = 64  # v1/attention/backends/gdn_attn.py

# platforms/cuda.py, _get_backend_priorities, for compute capability 9.x.
_HOPPER_MLA = ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA")
_HOPPER_ATTENTION = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
# FLASH_ATTN_MLA does not import on a CPU build (needs flash_attn_varlen_func); these
# are its class attributes from v1/attention/backends/mla/flashattn_mla.py.
_FLASH_ATTN_MLA = {
    "kv_dtypes": ("auto", "float16", "bfloat16"),
    "major": (9,),
    "kernel_blocks": (MultipleOf(16),),
}


class _Backend:
    """Name, KV dtypes, kernel block sizes, preferred block size of one backend."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "FLASH_ATTN_MLA":
            self.cls = None
            self.kv_dtypes = _FLASH_ATTN_MLA["kv_dtypes"]
            self.kernel_blocks = list(_FLASH_ATTN_MLA["kernel_blocks"])
            self.capable = HOPPER.major in _FLASH_ATTN_MLA["major"]
        else:
            self.cls = AttentionBackendEnum[name].get_class()
            self.kv_dtypes = tuple(self.cls.supported_kv_cache_dtypes)
            self.kernel_blocks = self.cls.get_supported_kernel_block_sizes()
            self.capable = self.cls.supports_compute_capability(HOPPER)

    def preferred_block_size(self, default: int) -> int:
        if self.cls is not None:
            return int(self.cls.get_preferred_block_size(default))
        if all(
            default % s.base == 0 if isinstance(s, MultipleOf) else default == s
            for s in self.kernel_blocks[:1]
        ):
            return default
        return min(s.base if isinstance(s, MultipleOf) else s for s in self.kernel_blocks)

    def get_supported_kernel_block_sizes(self) -> list[Any]:
        return list(self.kernel_blocks)

    def get_name(self) -> str:
        return self.name


def _pick_backend(use_mla: bool, kv_dtype: str) -> _Backend:
    for name in _HOPPER_MLA if use_mla else _HOPPER_ATTENTION:
        try:
            backend = _Backend(name)
        except (ImportError, ModuleNotFoundError):
            continue
        if backend.capable and kv_dtype in backend.kv_dtypes:
            return backend
    raise SystemExit(f"no backend for mla={use_mla} kv_dtype={kv_dtype}")


# -- the model: transformers config + the vLLM model files' layer kinds ----------------------


def _hf_config(path: Path) -> tuple[Any, Any, str]:
    raw = json.loads(path.read_text())
    model_type = raw.pop("model_type")
    config = AutoConfig.for_model(model_type, **raw)
    return config, config.get_text_config(), model_type


def _layer_kinds(text: Any, model_type: str) -> list[str]:
    """Per layer: full / sliding / chunked / mla / mamba / none (vLLM's model files)."""
    n = text.num_hidden_layers
    if model_type == "deepseek_v3":
        return ["mla"] * n
    if model_type == "jamba":
        period, offset = text.attn_layer_period, text.attn_layer_offset
        return ["full" if i % period == offset else "mamba" for i in range(n)]
    if model_type == "llama4":
        return [
            "full" if text.no_rope_layers[i] == 0 or not text.attention_chunk_size else "chunked"
            for i in range(n)
        ]
    if model_type == "nemotron_h":  # models/nemotron_h.py: M mamba, * attention
        return [{"M": "mamba", "*": "full"}.get(c, "none") for c in text.hybrid_override_pattern]
    if model_type == "qwen3_next":  # models/qwen3_next.py: layer_types
        return ["mamba" if t == "linear_attention" else "full" for t in text.layer_types]
    if model_type == "gpt_oss":  # models/gpt_oss.py: even layers sliding
        return ["sliding" if i % 2 == 0 else "full" for i in range(n)]
    if model_type == "gemma3":
        return ["sliding" if t == "sliding_attention" else "full" for t in text.layer_types]
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None and len(set(layer_types)) > 1:
        return ["sliding" if t == "sliding_attention" else "full" for t in layer_types]
    window = getattr(text, "sliding_window", None)
    uses_window = getattr(text, "use_sliding_window", True)
    return ["sliding" if window is not None and uses_window else "full"] * n


class _ModelConfig:
    """The ModelConfig attributes the platform hook reads."""

    model_impl = "auto"
    runner_type = "generate"
    convert_type = "none"
    hf_overrides: ClassVar[dict[str, Any]] = {}
    is_hybrid = True

    def __init__(self, hf: Any, text: Any, tp: int, max_model_len: int) -> None:
        self.hf_config, self.hf_text_config = hf, text
        self.architecture = hf.architectures[0]
        self.dtype = torch.bfloat16
        self.use_mla = False
        self.max_model_len = max_model_len
        self.original_max_model_len = max_model_len
        self._tp = tp

    def get_num_kv_heads(self, parallel_config: Any) -> int:
        return max(1, self.hf_text_config.num_key_value_heads // self._tp)

    def get_head_size(self) -> int:
        text = self.hf_text_config
        return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def _stand_in(
    model_config: Any, cache: CacheConfig, tp: int, mnbt: int, async_scheduling: bool, hybrid: bool
) -> Any:
    vc = types.SimpleNamespace(
        model_config=model_config,
        cache_config=cache,
        parallel_config=types.SimpleNamespace(
            tensor_parallel_size=tp, decode_context_parallel_size=1, pipeline_parallel_size=1
        ),
        scheduler_config=types.SimpleNamespace(
            max_num_batched_tokens=mnbt,
            async_scheduling=async_scheduling,
            disable_hybrid_kv_cache_manager=not hybrid,
            enable_chunked_prefill=True,
        ),
        attention_config=types.SimpleNamespace(hisparse_config=None),
        device_config=types.SimpleNamespace(device_type="cuda"),
        speculative_config=None,
        additional_config={},
        use_v2_model_runner=False,
        num_prefill_lookahead_tokens=0,
        num_speculative_tokens=0,
    )
    vc.max_concurrent_batches = VllmConfig.max_concurrent_batches.fget(vc)  # type: ignore[attr-defined]
    vc.max_in_flight_tokens = VllmConfig.max_in_flight_tokens.fget(vc)  # type: ignore[attr-defined]
    return vc


class _Qwen3NextStateHooks:
    """Stand-in for ``Qwen3NextForCausalLM``'s two state hooks, whose module does not
    import on a CPU build (it needs compressed_tensors): the same vLLM calculator calls
    as models/qwen3_next.py makes."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: Any) -> Any:
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

        text = vllm_config.model_config.hf_text_config
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            vllm_config.parallel_config.tensor_parallel_size,
            text.linear_num_key_heads,
            text.linear_num_value_heads,
            text.linear_key_head_dim,
            text.linear_value_head_dim,
            text.linear_conv_kernel_dim,
            0,
        )

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: Any) -> Any:
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator

        return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
            vllm_config.model_config.dtype,
            vllm_config.cache_config.mamba_cache_dtype,
            vllm_config.cache_config.mamba_ssm_cache_dtype,
        )


def _model_class(model_config: Any) -> Any:
    from vllm.model_executor.models import ModelRegistry

    if model_config.architecture == "Qwen3NextForCausalLM":
        return _Qwen3NextStateHooks
    return ModelRegistry.resolve_model_cls(model_config.architecture, model_config=model_config)[0]


def _patch_registry() -> None:
    from vllm.model_executor.models import ModelRegistry

    original = ModelRegistry.resolve_model_cls

    def resolve(architectures: Any, model_config: Any = None) -> Any:
        if model_config is not None and model_config.architecture == "Qwen3NextForCausalLM":
            return _Qwen3NextStateHooks, "Qwen3NextForCausalLM"
        return original(architectures, model_config=model_config)

    ModelRegistry.resolve_model_cls = resolve  # type: ignore[method-assign]


_MIXER_CHECKPOINT_ALIGNMENT = {
    "jamba": None,
    "nemotron_h": 1,
    "qwen3_next": GDN_FLASHINFER_CHECKPOINT_ALIGNMENT,
}


def plan_case(
    path: Path,
    *,
    tp: int,
    kv_dtype: str,
    memory_gib: int,
    mode: str,
    max_model_len: int = MAX_MODEL_LEN,
    mnbt: int = MAX_NUM_BATCHED_TOKENS,
    hybrid: bool = True,
) -> dict[str, Any]:
    """vLLM's plan for one case, as a JSON-ready dict."""
    hf, text, model_type = _hf_config(path)
    kinds = _layer_kinds(text, model_type)
    options = MODES[mode]
    use_mla = "mla" in kinds
    backend = _pick_backend(use_mla, kv_dtype)
    cache = CacheConfig(
        block_size=16, enable_prefix_caching=options["prefix_caching"], cache_dtype=kv_dtype
    )
    cache.kv_cache_layout = "NHD"
    model_config = _ModelConfig(hf, text, tp, max_model_len)
    model_config.use_mla = use_mla
    vc = _stand_in(model_config, cache, tp, mnbt, options["async_scheduling"], hybrid)
    cache.block_size = backend.preferred_block_size(16)
    has_mamba = "mamba" in kinds
    checkpoint_blocks = 0
    if has_mamba:
        cache.mamba_cache_mode = "align" if options["prefix_caching"] else "none"
        if model_type == "nemotron_h":  # the model's config hook: SSM state dtype
            from vllm.model_executor.models.config import NemotronHForCausalLMConfig

            NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(
                cache_config=cache, hf_config=hf
            )
        alignment = _MIXER_CHECKPOINT_ALIGNMENT[model_type]
        mamba_abstract.get_mamba_prefill_checkpoint_alignment = lambda _vc: alignment

        class _Hopper(Platform):
            @classmethod
            def _find_non_ssm_backends(cls, vllm_config: Any) -> list[Any]:
                return [backend.cls]

        _Hopper._align_hybrid_block_size(vc, backend.cls)
        if cache.mamba_cache_mode != "align":
            cache.mamba_block_size = max_model_len
        if cache.mamba_cache_mode == "align" and alignment is not None:
            checkpoint_blocks = 1
    block_size = cache.block_size
    quant = get_kv_quant_mode(kv_dtype)
    kv_torch = torch.bfloat16 if kv_dtype == "auto" else torch.uint8
    heads = model_config.get_num_kv_heads(None)
    head_size = model_config.get_head_size()
    common = dict(
        block_size=block_size,
        num_kv_heads=heads,
        head_size=head_size,
        dtype=kv_torch,
        kv_quant_mode=quant,
    )
    specs: dict[str, KVCacheSpec] = {}
    mamba_spec: MambaSpec | None = None
    if has_mamba:
        model_cls = _model_class(model_config)
        mamba_spec = MambaSpec(
            shapes=model_cls.get_mamba_state_shape_from_config(vc),
            dtypes=model_cls.get_mamba_state_dtype_from_config(vc),
            block_size=cache.mamba_block_size,
            page_size_padded=cache.mamba_page_size_padded,
            mamba_cache_mode=cache.mamba_cache_mode,
            num_prefill_checkpoint_blocks=checkpoint_blocks,
        )
    for index, kind in enumerate(kinds):
        name = f"layers.{index}"
        if kind == "full":
            specs[name] = FullAttentionSpec(**common)
        elif kind == "sliding":
            specs[name] = SlidingWindowSpec(**common, sliding_window=text.sliding_window)
        elif kind == "chunked":
            specs[name] = ChunkedLocalAttentionSpec(
                **common, attention_chunk_size=text.attention_chunk_size
            )
        elif kind == "mla":
            specs[name] = MLAAttentionSpec(
                block_size=block_size,
                num_kv_heads=1,
                head_size=text.kv_lora_rank + text.qk_rope_head_dim,
                dtype=kv_torch,
                kv_quant_mode=quant,
                cache_dtype_str=kv_dtype,
            )
        elif kind == "mamba":
            assert mamba_spec is not None
            specs[name] = mamba_spec
    case: dict[str, Any] = {
        "model": path.stem,
        "config": str(path),
        "tp": tp,
        "kv_dtype": kv_dtype,
        "memory_gib": memory_gib,
        "mode": mode,
        "hybrid": hybrid,
        "max_model_len": max_model_len,
        "max_num_batched_tokens": mnbt,
        "backend": backend.name,
    }
    try:
        groups = get_kv_cache_groups(vc, dict(specs))
        config = get_kv_cache_configs(vc, [dict(specs)], [memory_gib << 30], groups)[0]
    except (ValueError, NotImplementedError) as exc:
        case["error"] = str(exc).split(". ")[0]
        return case
    tokens, concurrency = get_kv_cache_capacity(vc, config)
    group_specs = [g.kv_cache_spec for g in config.kv_cache_groups]
    pages = {s.page_size_bytes for s in group_specs}
    case.update(
        block_size=block_size,
        num_blocks=config.num_blocks,
        groups=[
            {"kind": type(g.kv_cache_spec).__name__, "layers": list(g.layer_names)}
            for g in config.kv_cache_groups
        ],
        blocks_per_request=sum(
            cdiv(s.max_memory_usage_bytes(vc), s.page_size_bytes) for s in group_specs
        ),
        max_concurrency=concurrency,
        kv_cache_size_tokens=tokens,
        log_line=(
            f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
            f"{max_model_len:,} tokens per request: {concurrency:.2f}x"
        ),
        page_size_bytes=pages.pop() if len(pages) == 1 else None,
        mamba_padding_pct=(
            None
            if mamba_spec is None or mamba_spec.page_size_padded is None
            else round(
                100
                * (mamba_spec.page_size_padded - mamba_spec.real_page_size_bytes)
                / mamba_spec.real_page_size_bytes,
                4,
            )
        ),
    )
    return case


def _constructed_cases(config_dir: Path) -> list[dict[str, Any]]:
    """The constructed configs of held-back families: TP 1/2, bf16, both memory sizes,
    every mode, at max_model_len 32,768 and at the config's own limit."""
    out = []
    for path in sorted(config_dir.glob("*.json")):
        _, text, _ = _hf_config(path)
        for tp in (1, 2):
            for memory in MEMORY_GIB:
                for mode in MODES:
                    out.append(
                        plan_case(path, tp=tp, kv_dtype="auto", memory_gib=memory, mode=mode)
                    )
        out.append(
            plan_case(
                path,
                tp=2,
                kv_dtype="auto",
                memory_gib=48,
                mode="defaults",
                max_model_len=text.max_position_embeddings,
            )
        )
        out.append(
            plan_case(path, tp=1, kv_dtype="auto", memory_gib=16, mode="defaults", hybrid=False)
        )
    return out


def _cases(config_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(config_dir.glob("*.json")):
        _, text, _ = _hf_config(path)
        for tp in TP_SIZES:
            if text.num_attention_heads % tp:
                continue
            for kv_dtype in KV_DTYPES:
                for memory in MEMORY_GIB:
                    for mode in MODES:
                        out.append(
                            plan_case(path, tp=tp, kv_dtype=kv_dtype, memory_gib=memory, mode=mode)
                        )
    for name in ("Mistral-7B-v0.1", "Gemma-3-27B-it", "AI21-Jamba-1.5-Mini"):
        out.append(
            plan_case(
                config_dir / f"{name}.json",
                tp=1,
                kv_dtype="auto",
                memory_gib=16,
                mode="defaults",
                hybrid=False,
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=Path, default=Path("src/pagedkv/data/model_configs"))
    parser.add_argument("--out", type=Path, default=Path("tests/planner/vllm_expected.json"))
    parser.add_argument(
        "--constructed",
        action="store_true",
        help="--configs holds constructed configs of held-back families: "
        "plan the smaller table of _constructed_cases",
    )
    args = parser.parse_args(argv)
    _patch_registry()
    cases = _constructed_cases(args.configs) if args.constructed else _cases(args.configs)
    args.out.write_text(
        json.dumps({"vllm": "0.33.0", "gpu": "hopper", "cases": cases}, indent=1) + "\n"
    )
    print(f"{len(cases)} cases -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
