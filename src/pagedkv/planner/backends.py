"""GPU families and attention backends: the block size vLLM 0.33 picks.

vLLM's CUDA platform picks the first backend of a priority list that supports the KV
dtype and the GPU, then the smallest block size that backend's kernels accept (16 when
they accept it). Only the facts that decide the KV-cache layout are kept here:

=============  ===================  =================  ============================
backend        KV dtypes            kernel blocks      GPUs (compute capability)
=============  ===================  =================  ============================
FLASH_ATTN     bf16, fp16, fp8      multiple of 16     8.0+
TRITON_ATTN    bf16, fp16, fp8, fp32  multiple of 16   any
FLASH_ATTN_MLA bf16, fp16           multiple of 16     9.x
FLASHMLA       bf16, fp16, fp8      exactly 64         9.x, 10.x
TRITON_MLA     bf16, fp16, fp8, fp32  multiple of 16   any
FLASHINFER     bf16, fp16, fp8      multiple of 16     8.0+ (first on 10.x)
FLASHINFER_MLA bf16, fp16, fp8      32 or 64           10.x
CUTLASS_MLA    bf16, fp16, fp8      exactly 128        10.x
ROCM_ATTN      bf16, fp16, fp8      multiple of 16     ROCm (AMD) only
=============  ===================  =================  ============================

Which GPU is which family is the GPU table's word (:mod:`pagedkv.planner.gpus`);
:func:`gpu_family` takes any name that table takes (``b200``, ``H100-SXM``, ``hopper``).
The families beyond hopper and ampere follow vLLM's backend priority lists for their
platform; their plans are not checked against a run of vLLM on that GPU.

>>> family = GPU_FAMILIES["hopper"]
>>> pick_backend(family, use_mla=True, kv_dtype="fp8").name
'FLASHMLA'
>>> pick_backend(family, use_mla=True, kv_dtype="fp8").preferred_block_size(16)
64
>>> pick_backend(gpu_family("b200"), use_mla=False, kv_dtype="bf16").name
'FLASHINFER'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pagedkv.errors import ConfigError

__all__ = ["BACKENDS", "GPU_FAMILIES", "AttentionBackend", "GpuFamily", "gpu_family",
           "pick_backend"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionBackend:
    """One attention backend: KV dtypes it takes, its kernel block sizes (``multiple_of``
    a base, or ``exact`` sizes) and the compute-capability majors it runs on (empty: all)."""

    name: str
    mla: bool
    kv_dtypes: frozenset[str]
    multiple_of: int | None = None
    exact: tuple[int, ...] = ()
    majors: frozenset[int] = frozenset()
    min_major: int = 0
    rocm: bool = False

    def supports(self, *, kv_dtype: str, major: int, rocm: bool = False) -> bool:
        """Whether it runs ``kv_dtype`` (a short name: bf16, fp16, fp8) on ``major`` (of
        an AMD GPU with ``rocm``: ROCm-only backends, and the portable Triton ones)."""
        on_gpu = (major in self.majors) if self.majors else major >= self.min_major
        if rocm:
            on_gpu = self.rocm or self.name.startswith("TRITON")
        elif self.rocm:
            on_gpu = False
        return on_gpu and kv_dtype in self.kv_dtypes

    def supports_block_size(self, block_size: int) -> bool:
        if self.multiple_of is not None:
            return block_size % self.multiple_of == 0
        return block_size in self.exact

    def preferred_block_size(self, default: int) -> int:
        """``default`` when the kernels accept it, else the smallest size they accept."""
        if self.supports_block_size(default):
            return default
        return self.multiple_of if self.multiple_of is not None else min(self.exact)

    @property
    def alignment(self) -> int:
        """The smallest kernel block: grown block sizes are multiples of it."""
        return self.multiple_of if self.multiple_of is not None else min(self.exact)


_FP = frozenset({"bf16", "fp16", "fp8"})
BACKENDS: Mapping[str, AttentionBackend] = {b.name: b for b in (
    AttentionBackend(name="FLASH_ATTN", mla=False, kv_dtypes=_FP, multiple_of=16,
                     min_major=8),
    AttentionBackend(name="TRITON_ATTN", mla=False, kv_dtypes=_FP | {"fp32"},
                     multiple_of=16),
    AttentionBackend(name="FLASH_ATTN_MLA", mla=True, kv_dtypes=frozenset({"bf16", "fp16"}),
                     multiple_of=16, majors=frozenset({9})),
    AttentionBackend(name="FLASHMLA", mla=True, kv_dtypes=_FP, exact=(64,),
                     majors=frozenset({9, 10})),
    AttentionBackend(name="TRITON_MLA", mla=True, kv_dtypes=_FP | {"fp32"},
                     multiple_of=16),
    AttentionBackend(name="FLASHINFER", mla=False, kv_dtypes=_FP, multiple_of=16,
                     min_major=8),
    AttentionBackend(name="FLASHINFER_MLA", mla=True, kv_dtypes=_FP, exact=(32, 64),
                     majors=frozenset({10})),
    AttentionBackend(name="CUTLASS_MLA", mla=True, kv_dtypes=_FP, exact=(128,),
                     majors=frozenset({10})),
    AttentionBackend(name="ROCM_ATTN", mla=False, kv_dtypes=_FP, multiple_of=16, rocm=True),
)}


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFamily:
    """A GPU family: its compute capability (``rocm``: an AMD GPU), backend priorities,
    the ``max_num_batched_tokens`` ``vllm serve`` defaults to on its reference card (the
    GPU's own rule is :attr:`pagedkv.planner.gpus.GpuSpec.serve_batched_tokens`), and the
    prefill-checkpoint alignment of the gated delta-net mixer (FlashInfer's GDN prefill on
    Hopper; ``None``: no checkpoints)."""

    name: str
    examples: str
    major: int
    attention_priority: tuple[str, ...]
    mla_priority: tuple[str, ...]
    default_max_num_batched_tokens: int
    gdn_checkpoint_alignment: int | None
    rocm: bool = False


GPU_FAMILIES: Mapping[str, GpuFamily] = {f.name: f for f in (
    GpuFamily(name="hopper", examples="H100, H200", major=9,
              attention_priority=("FLASH_ATTN", "TRITON_ATTN"),
              mla_priority=("FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"),
              default_max_num_batched_tokens=8192, gdn_checkpoint_alignment=64),
    GpuFamily(name="ampere", examples="A100", major=8,
              attention_priority=("FLASH_ATTN", "TRITON_ATTN"),
              mla_priority=("TRITON_MLA",),
              default_max_num_batched_tokens=2048, gdn_checkpoint_alignment=None),
    GpuFamily(name="blackwell", examples="B200", major=10,
              attention_priority=("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN"),
              mla_priority=("FLASHINFER_MLA", "CUTLASS_MLA", "FLASHMLA", "TRITON_MLA"),
              default_max_num_batched_tokens=16384, gdn_checkpoint_alignment=None),
    GpuFamily(name="ada", examples="L40S", major=8,
              attention_priority=("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"),
              mla_priority=("TRITON_MLA",),
              default_max_num_batched_tokens=2048, gdn_checkpoint_alignment=None),
    GpuFamily(name="cdna3", examples="MI300X", major=9, rocm=True,
              attention_priority=("ROCM_ATTN", "TRITON_ATTN"), mla_priority=("TRITON_MLA",),
              default_max_num_batched_tokens=16384, gdn_checkpoint_alignment=None),
)}


def gpu_family(name: str) -> GpuFamily:
    """The family of the GPU ``name``: any spelling of the GPU table
    (:func:`pagedkv.planner.gpus.resolve_gpu`: ``h100``, ``B200``, ``hopper``, a JSON spec).

    Raises:
        InvalidArgumentError: an unknown name (names the close matches, lists the known).
        InputFileError: a bad JSON spec.
    """
    from pagedkv.planner.gpus import resolve_gpu

    return GPU_FAMILIES[resolve_gpu(name).family]


def pick_backend(family: GpuFamily, *, use_mla: bool, kv_dtype: str,
                 requested: str | None = None) -> AttentionBackend:
    """The backend vLLM would use (or ``requested``, checked).

    Raises:
        ConfigError: ``requested`` is unknown or cannot run this KV dtype / attention kind
            on this GPU; no backend can.
    """
    if requested is not None:
        backend = BACKENDS.get(requested.upper())
        if backend is None:
            raise ConfigError(f"unknown attention backend {requested!r}; choose one of "
                              f"{', '.join(BACKENDS)}")
        if backend.mla != use_mla or not backend.supports(
                kv_dtype=kv_dtype, major=family.major, rocm=family.rocm):
            kind = "MLA" if use_mla else "standard attention"
            raise ConfigError(f"attention backend {backend.name} cannot run {kind} with KV "
                              f"dtype {kv_dtype} on {family.name}; choose another backend")
        return backend
    for name in family.mla_priority if use_mla else family.attention_priority:
        backend = BACKENDS[name]
        if backend.supports(kv_dtype=kv_dtype, major=family.major, rocm=family.rocm):
            return backend
    raise ConfigError(f"no attention backend runs KV dtype {kv_dtype} on {family.name}")
