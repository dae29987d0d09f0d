"""The clock's constants: named sets, and the calibration file ``--calibrate`` writes and
``--calibration FILE`` reads (``docs/simulator.md``, "The clock", gives each default's
published source).

File format (JSON; the fitted constants, :data:`FITTED`, required; ``name``, ``fit`` and
the other constants optional, defaulting to the ``default`` set's)::

    {"name": "my-h100", "hbm_efficiency": 0.85, "compute_utilization": 0.6,
     "step_overhead_s": 0.0006, "seq_overhead_s": 2e-05, "layer_overhead_s": 5e-06}

>>> CONSTANT_SETS["default"].hbm_efficiency
0.85
>>> load_constants("ideal").step_overhead_s
0.0
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pagedkv.errors import InputFileError, InvalidArgumentError
from pagedkv.input_files import load_document

__all__ = ["CONSTANT_SETS", "FITTED", "ClockConstants", "load_constants", "save_constants"]

#: The constants ``--calibrate`` fits (the others keep their set's value).
FITTED = ("hbm_efficiency", "compute_utilization", "step_overhead_s", "seq_overhead_s",
          "request_latency_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockConstants:
    """How close a step comes to the GPU's peaks, and what it costs besides.

    ``hbm_efficiency``: share of HBM bandwidth weight and KV streaming reach (0, 1];
    ``compute_utilization``: share of dense peak FLOP/s a large GEMM reaches (0, 1];
    ``util_half_tokens``: the step token count at which GEMMs reach half of it
    (utilisation ramps as ``u * T / (T + half)``); ``step_overhead_s``: per step
    (scheduling, launch, sampling setup); ``seq_overhead_s``: per scheduled sequence;
    ``layer_overhead_s``: per layer per step (kernel gaps); ``allreduce_latency_s``: per
    tensor-parallel all-reduce (two per layer); ``request_latency_s``: from a client
    sending a request to the engine seeing it (HTTP, chat template, tokenisation — the
    API server's path, outside the GPU's steps), in every TTFT and end-to-end latency.

    ``moe_fp8_hbm_efficiency`` and ``moe_fp8_compute_utilization``: the shares of HBM
    bandwidth and of dense FP8 peak FLOP/s that routed-expert (fused-MoE, grouped) GEMMs
    with FP8 weights reach on a GPU with FP8 math (0, 1]; BF16 experts and GPUs without
    FP8 use ``hbm_efficiency`` and ``compute_utilization``."""

    name: str = "default"
    hbm_efficiency: float = 0.85
    compute_utilization: float = 0.6
    util_half_tokens: float = 64.0
    step_overhead_s: float = 0.0006
    seq_overhead_s: float = 20e-6
    layer_overhead_s: float = 5e-6
    allreduce_latency_s: float = 10e-6
    request_latency_s: float = 0.012
    moe_fp8_hbm_efficiency: float = 0.66
    moe_fp8_compute_utilization: float = 0.11

    def __post_init__(self) -> None:
        for key in ("hbm_efficiency", "compute_utilization", "moe_fp8_hbm_efficiency",
                    "moe_fp8_compute_utilization"):
            v = getattr(self, key)
            if not _is_number(v) or not 0.0 < v <= 1.0:
                raise InvalidArgumentError(
                    f"clock constant {key} must be a number in (0, 1], got {v!r}")
        for key in ("util_half_tokens", "step_overhead_s", "seq_overhead_s",
                    "layer_overhead_s", "allreduce_latency_s", "request_latency_s"):
            v = getattr(self, key)
            if not _is_number(v) or v < 0 or v > 1e6:
                raise InvalidArgumentError(
                    f"clock constant {key} must be a finite number >= 0, got {v!r}")

    def with_values(self, values: Mapping[str, float], *, name: str) -> ClockConstants:
        """A copy with ``values`` replaced (checked as on construction)."""
        return replace(self, name=name, **dict(values))


def _is_number(v: object) -> bool:
    return (not isinstance(v, bool) and isinstance(v, (int, float))
            and math.isfinite(v))


#: Named sets. ``default``: the zero-fit defaults; ``offline``: the defaults for an engine
#: driven in-process (``LLM.generate``, ``LLMEngine``, ``vllm bench throughput``, MLPerf
#: offline): no API server between client and engine, so no request latency;
#: ``ideal``: the hardware bound (peak bandwidth and FLOP/s, no overheads, no request
#: latency) — every real step is slower.
CONSTANT_SETS: Mapping[str, ClockConstants] = {
    "default": ClockConstants(),
    "offline": ClockConstants(name="offline", request_latency_s=0.0),
    "ideal": ClockConstants(name="ideal", hbm_efficiency=1.0, compute_utilization=1.0,
                            util_half_tokens=0.0, step_overhead_s=0.0, seq_overhead_s=0.0,
                            layer_overhead_s=0.0, allreduce_latency_s=0.0,
                            request_latency_s=0.0, moe_fp8_hbm_efficiency=1.0,
                            moe_fp8_compute_utilization=1.0),
}

_KEYS = ("name", "hbm_efficiency", "compute_utilization", "util_half_tokens",
         "step_overhead_s", "seq_overhead_s", "layer_overhead_s", "allreduce_latency_s",
         "request_latency_s", "moe_fp8_hbm_efficiency", "moe_fp8_compute_utilization",
         "fit")


def load_constants(text: str | None) -> ClockConstants:
    """``--calibration``: a set name (:data:`CONSTANT_SETS`) or a calibration file.

    Raises:
        InvalidArgumentError: an unknown name that is no file either.
        InputFileError: a file that is not JSON, has unknown keys, or holds a value that
            is not a finite number in range (NaN, negative, text).
    """
    if text is None:
        return CONSTANT_SETS["default"]
    if text in CONSTANT_SETS:
        return CONSTANT_SETS[text]
    path = Path(text)
    if not path.is_file():
        raise InvalidArgumentError(
            f"--calibration {text!r}: no such constant set or file; give one of "
            f"{', '.join(CONSTANT_SETS)} or a file written by --calibrate")
    data: Any = load_document(path, what="calibration", fmt="json",
                              hint="; write it again with --calibrate")
    if not isinstance(data, Mapping):
        raise InputFileError(str(path), "a calibration is a JSON object of constants")
    for key in data:
        if key not in _KEYS:
            raise InputFileError(str(path), f"unknown key; keys are {', '.join(_KEYS[:-1])}",
                                 key=str(key))
    values = {k: v for k, v in data.items() if k not in ("name", "fit")}
    for key in FITTED:
        if key not in values:
            raise InputFileError(str(path), "missing from the calibration; write it again "
                                 "with --calibrate", key=key)
    try:
        return replace(CONSTANT_SETS["default"], name=str(data.get("name", path.stem)),
                       **values)
    except InvalidArgumentError as exc:
        raise InputFileError(str(path), str(exc)) from None



def save_constants(constants: ClockConstants, path: str | Path,
                   fit: Mapping[str, Any] | None = None) -> Path:
    """Write ``constants`` (and the fit's figures) as a calibration file; returns it."""
    out = asdict(constants)
    if fit:
        out["fit"] = dict(fit)
    p = Path(path)
    p.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return p
