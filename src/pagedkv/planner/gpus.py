"""The one table of GPUs every command knows (``plan --gpu``, ``simulate --gpu``, sweeps):
dense peak FLOP rates, HBM bandwidth, memory and interconnect, each from the vendor's data
sheet (``docs/simulator.md``, "The clock", lists the sources), and the architecture family
whose attention backends the planner picks (hopper, ampere, blackwell, ada, cdna3).

Names are case-insensitive; a family (``hopper``) or a short alias (``h100``) names one
card of the table (:func:`find_gpu`), and a misspelled name gets the close matches.

Figures are the **dense** tensor-core rates (the data sheets' "with sparsity" figures are
twice these). A GPU without FP8 tensor cores (A100) has ``fp8_tflops`` None: FP8 weights
there run at the BF16 rate. Memory follows the project's convention: an "80 GB" card holds
80 GiB (what ``--gpu-memory`` defaults to).

A GPU the table lacks is given as a small JSON file (:func:`load_gpu_spec`)::

    {"name": "my-gpu", "bf16_tflops": 400, "fp8_tflops": 800, "hbm_tb_s": 2.0,
     "memory_gib": 64, "interconnect_gb_s": 300}

>>> gpu = find_gpu("h100")
>>> gpu.name, gpu.bf16_tflops, gpu.hbm_tb_s, gpu.memory
('H100-SXM', 989.4, 3.35, '80GiB')
>>> find_gpu("a100-80gb").peak_flops(weight_bytes_per_param=1.0)  # no FP8: the BF16 rate
312000000000000.0
>>> find_gpu("b200").family, find_gpu("hopper").name, find_gpu("B200").serve_batched_tokens
('blackwell', 'H100-SXM', 16384)
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.arg_types import check_fields
from pagedkv.errors import InputFileError, InvalidArgumentError
from pagedkv.input_files import load_document

__all__ = ["DEFAULT_GPU", "FAMILIES", "GPUS", "GpuSpec", "close_matches", "find_gpu",
           "gpu_names", "gpu_spellings", "load_gpu_spec", "resolve_gpu"]

#: The architecture families the planner knows (:mod:`pagedkv.planner.backends`).
FAMILIES = ("hopper", "ampere", "blackwell", "ada", "cdna3")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One GPU: dense tensor-core peaks (TFLOP/s), HBM bandwidth (TB/s), memory (GiB),
    the GPU-to-GPU bandwidth tensor parallelism uses (GB/s, one direction), where the
    figures come from, and the architecture ``family`` (one of :data:`FAMILIES`)."""

    name: str
    bf16_tflops: float
    fp8_tflops: float | None
    hbm_tb_s: float
    memory_gib: float
    interconnect_gb_s: float
    interconnect: str = ""
    source: str = ""
    family: str = "hopper"
    #: the step token count at which this machine's GEMMs reach half of their large-batch
    #: rate, where it was measured (a CPU spec); None: the clock's ``util_half_tokens``
    gemm_half_tokens: float | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise InvalidArgumentError(
                f"GPU spec {self.name}: family must be one of {', '.join(FAMILIES)}, got "
                f"{self.family!r}")
        for key in ("bf16_tflops", "hbm_tb_s", "memory_gib", "interconnect_gb_s"):
            _check_positive(key, getattr(self, key), self.name)
        for key in ("fp8_tflops", "gemm_half_tokens"):
            if getattr(self, key) is not None:
                _check_positive(key, getattr(self, key), self.name)
        check_fields(self)

    @property
    def memory(self) -> str:
        """Memory as ``--gpu-memory`` takes it (``80GiB``)."""
        return f"{self.memory_gib:g}GiB"

    @property
    def serve_batched_tokens(self) -> int:
        """``vllm serve``'s default ``max_num_batched_tokens`` on this GPU
        (:meth:`vllm_batch_defaults`)."""
        return self.vllm_batch_defaults()[0]

    def vllm_batch_defaults(self, *, server: bool = True) -> tuple[int, int]:
        """vLLM's default ``--max-num-batched-tokens`` and ``--max-num-seqs`` on this GPU,
        behind the API server (``vllm serve``) or in-process (``LLM``, MLPerf offline):
        the tiers of ``EngineArgs.get_batch_defaults`` (``vllm/engine/arg_utils.py``,
        vLLM 0.33.0). 160 GiB and up: 16,384 / 1,024 both ways; 70 GiB and up except
        A100s: 8,192 / 1,024 served, 16,384 / 1,024 in-process; anything else 2,048 / 256
        served, 8,192 / 256 in-process.

        >>> find_gpu("L40S").vllm_batch_defaults(), find_gpu("H100").vllm_batch_defaults(
        ...     server=False)
        ((2048, 256), (16384, 1024))
        """
        if self.memory_gib >= 160:
            return 16384, 1024
        if self.memory_gib >= 70 and "a100" not in self.name.lower():
            return (8192 if server else 16384), 1024
        return (2048 if server else 8192), 256

    @property
    def hbm_bytes_s(self) -> float:
        return self.hbm_tb_s * 1e12

    @property
    def interconnect_bytes_s(self) -> float:
        return self.interconnect_gb_s * 1e9

    def peak_flops(self, *, weight_bytes_per_param: float = 2.0) -> float:
        """Dense peak FLOP/s for matrices of weights that size: FP8 (or smaller) weights
        use the FP8 rate where the GPU has one, else the BF16 rate."""
        if weight_bytes_per_param <= 1.0 and self.fp8_tflops is not None:
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12


def _check_positive(key: str, value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"GPU spec {where}: {key} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(
            f"GPU spec {where}: {key} must be a finite number > 0, got {value!r}")


_NV = "NVIDIA data sheet"
#: The table (docs/simulator.md gives each source's address).
GPUS: Mapping[str, GpuSpec] = {g.name: g for g in (
    GpuSpec(name="A100-40GB", bf16_tflops=312.0, fp8_tflops=None, hbm_tb_s=1.555,
            memory_gib=40, interconnect_gb_s=300.0, interconnect="NVLink 3 (600 GB/s bidir.)",
            source=f"{_NV}: A100 Tensor Core GPU (SXM4 40GB)", family="ampere"),
    GpuSpec(name="A100-80GB", bf16_tflops=312.0, fp8_tflops=None, hbm_tb_s=2.039,
            memory_gib=80, interconnect_gb_s=300.0, interconnect="NVLink 3 (600 GB/s bidir.)",
            source=f"{_NV}: A100 Tensor Core GPU (SXM4 80GB)", family="ampere"),
    GpuSpec(name="H100-SXM", bf16_tflops=989.4, fp8_tflops=1978.9, hbm_tb_s=3.35,
            memory_gib=80, interconnect_gb_s=450.0, interconnect="NVLink 4 (900 GB/s bidir.)",
            source=f"{_NV}: H100 Tensor Core GPU (SXM)"),
    GpuSpec(name="H100-PCIe", bf16_tflops=756.0, fp8_tflops=1513.0, hbm_tb_s=2.0,
            memory_gib=80, interconnect_gb_s=64.0, interconnect="PCIe Gen5 x16 (128 GB/s bidir.)",
            source=f"{_NV}: H100 Tensor Core GPU (PCIe)"),
    GpuSpec(name="H200", bf16_tflops=989.4, fp8_tflops=1978.9, hbm_tb_s=4.8,
            memory_gib=141, interconnect_gb_s=450.0, interconnect="NVLink 4 (900 GB/s bidir.)",
            source=f"{_NV}: H200 Tensor Core GPU (SXM)"),
    GpuSpec(name="B200", bf16_tflops=2250.0, fp8_tflops=4500.0, hbm_tb_s=8.0,
            memory_gib=180, interconnect_gb_s=900.0, interconnect="NVLink 5 (1.8 TB/s bidir.)",
            source=f"{_NV}: HGX B200 (per GPU)", family="blackwell"),
    GpuSpec(name="L40S", bf16_tflops=362.05, fp8_tflops=733.0, hbm_tb_s=0.864,
            memory_gib=48, interconnect_gb_s=32.0, interconnect="PCIe Gen4 x16 (64 GB/s bidir.)",
            source=f"{_NV}: L40S GPU (GDDR6 864 GB/s)", family="ada"),
    GpuSpec(name="MI300X", bf16_tflops=1307.4, fp8_tflops=2614.9, hbm_tb_s=5.3,
            memory_gib=192, interconnect_gb_s=448.0,
            interconnect="Infinity Fabric (7 x 64 GB/s per direction)",
            source="AMD Instinct MI300X data sheet", family="cdna3"),
)}

#: What ``--gpu`` defaults to (the default ``--gpu-memory`` is its memory).
DEFAULT_GPU = "H100-SXM"

#: Short names and families -> the table's name (a family names its reference card).
_ALIASES: Mapping[str, str] = {
    "a100": "A100-80GB", "a100-80g": "A100-80GB", "a100-40g": "A100-40GB",
    "h100": "H100-SXM", "h100-80gb": "H100-SXM", "h100-sxm5": "H100-SXM",
    "h200-sxm": "H200", "h200-141gb": "H200", "b200-180gb": "B200", "mi300": "MI300X",
    "hopper": "H100-SXM", "ampere": "A100-80GB", "blackwell": "B200", "ada": "L40S",
    "cdna3": "MI300X",
}


def gpu_names() -> list[str]:
    """The table's names."""
    return list(GPUS)


def gpu_spellings() -> list[str]:
    """Every spelling :func:`find_gpu` takes (lower case): the names, aliases, families."""
    return [*(g.lower() for g in GPUS), *_ALIASES]


def close_matches(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean X or Y?)`` for the choices close to ``word`` (case-insensitive),
    else ``""``.

    >>> close_matches("Qwen3-23B", ["Qwen3-32B", "Qwen3-8B", "Llama-3.1-8B"])
    " (did you mean 'Qwen3-32B' or 'Qwen3-8B'?)"
    """
    lower = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(word.lower(), list(lower), n=3, cutoff=0.6)
    if not found:
        return ""
    names = [repr(lower[f]) for f in found]
    return f" (did you mean {' or '.join(names)}?)"


def find_gpu(name: str) -> GpuSpec:
    """The table's GPU called ``name`` (case-insensitive; ``h100`` is the SXM card, a
    family such as ``blackwell`` its reference card).

    Raises:
        InvalidArgumentError: an unknown name (the message names the close matches, lists
            the known ones and says how to describe another GPU).
    """
    key = name.strip().lower()
    for gpu in GPUS.values():
        if gpu.name.lower() == key:
            return gpu
    alias = _ALIASES.get(key)
    if alias is not None:
        return GPUS[alias]
    spelled = difflib.get_close_matches(key, gpu_spellings(), n=4, cutoff=0.6)
    named = dict.fromkeys(_ALIASES.get(w) or find_gpu(w).name for w in spelled)
    close = f" (did you mean {' or '.join(map(repr, named))}?)" if named else ""
    raise InvalidArgumentError(
        f"unknown GPU {name!r}{close}: give one of {', '.join(GPUS)} (or a family: "
        f"{', '.join(FAMILIES)}), or a JSON spec file "
        '({"name", "bf16_tflops", "hbm_tb_s", "memory_gib", "interconnect_gb_s"})')


_FIELDS = ("name", "bf16_tflops", "fp8_tflops", "hbm_tb_s", "memory_gib",
           "interconnect_gb_s", "interconnect", "source", "family", "gemm_half_tokens")
_REQUIRED = ("bf16_tflops", "hbm_tb_s", "memory_gib")


def load_gpu_spec(path: str | Path) -> GpuSpec:
    """A GPU from a JSON file (module docstring): ``bf16_tflops``, ``hbm_tb_s`` and
    ``memory_gib`` are required; ``fp8_tflops`` (default none), ``interconnect_gb_s``
    (default 64, PCIe Gen5), ``name`` (default the file name), ``family`` (the planner's
    backends, default hopper) and ``gemm_half_tokens`` (measured GEMM ramp,
    :class:`GpuSpec`; default the clock's) optional.

    Raises:
        InputFileError: unreadable or not JSON, a missing or unknown key, a value that is
            not a finite positive number (NaN, negative, text).
    """
    p = Path(path)
    data: Any = load_document(p, what="GPU spec", fmt="json",
                              hint="; the GPU spec must be a JSON object")
    if not isinstance(data, Mapping):
        raise InputFileError(str(p), f"a GPU spec is a JSON object with {', '.join(_REQUIRED)}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise InputFileError(str(p), f"unknown key in the GPU spec; keys are "
                             f"{', '.join(_FIELDS)}", key=unknown[0])
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise InputFileError(str(p), f"missing from the GPU spec; give "
                             f"{', '.join(_REQUIRED)} (and interconnect_gb_s for TP)",
                             key=missing[0])
    try:
        return GpuSpec(
            name=str(data.get("name", p.stem)), bf16_tflops=data["bf16_tflops"],
            fp8_tflops=data.get("fp8_tflops"), hbm_tb_s=data["hbm_tb_s"],
            memory_gib=data["memory_gib"], interconnect_gb_s=data.get("interconnect_gb_s", 64.0),
            interconnect=str(data.get("interconnect", "")), source=f"spec file {p.name}",
            family=str(data.get("family", "hopper")),
            gemm_half_tokens=data.get("gemm_half_tokens"))
    except InvalidArgumentError as exc:
        raise InputFileError(str(p), str(exc)) from None


def resolve_gpu(text: str | None) -> GpuSpec:
    """``--gpu``: a table name, or a path to a JSON spec (ends in ``.json``); None: the
    default (:data:`DEFAULT_GPU`).

    Raises:
        InvalidArgumentError, InputFileError: as :func:`find_gpu`, :func:`load_gpu_spec`.
    """
    if text is None:
        return GPUS[DEFAULT_GPU]
    if text.lower().endswith(".json") or Path(text).is_file():
        return load_gpu_spec(text)
    return find_gpu(text)
