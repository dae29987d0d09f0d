"""The simulator's clock: how long an engine step takes.

* :mod:`~pagedkv.sim.clock.roofline` — the roofline clock (the default whenever the model
  is known): weights, FLOPs, each KV-cache kind's reads from the step's real batch,
  tensor-parallel all-reduces and host overheads;
* :mod:`~pagedkv.sim.clock.shape` — the model as the clock sees it (planner readers);
* :mod:`~pagedkv.sim.clock.constants` — named constant sets and calibration files;
* :mod:`~pagedkv.sim.clock.calibrate` — ``--calibrate``: constants fitted to measured
  ``vllm bench serve`` / GuideLLM results;
* :mod:`~pagedkv.sim.clock.validation` — published measurements the clock is checked on.

A run's clock is chosen by :func:`pagedkv.sim.api.with_clock`. The GPU table is
:mod:`pagedkv.planner.gpus` (the planner sizes memory from it too). The
linear model (:class:`pagedkv.sim.StepTimeModel`) stays for reference runs
(``--step-model linear``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pagedkv.sim.clock.constants import CONSTANT_SETS, ClockConstants
from pagedkv.sim.clock.roofline import TERMS, RooflineStepModel
from pagedkv.sim.clock.shape import ModelShape, model_shape
from pagedkv.sim.scheduler import StepTimeModel
from pagedkv.sim.workloads import Workload

if TYPE_CHECKING:
    from pagedkv.sim.results import SimResult

__all__ = [
    "CONSTANT_SETS",
    "STEP_MODELS",
    "TERMS",
    "ClockConstants",
    "ModelShape",
    "RooflineStepModel",
    "clock_summary",
    "model_shape",
    "typical_context",
]

STEP_MODELS = ("auto", "roofline", "linear")


def typical_context(workload: Workload) -> int:
    """Mean context a decoding request has: prompt + half its output, over requests."""
    reqs = workload.requests
    if not reqs:
        return 1
    total = sum(r.num_prompt_tokens + max(1, r.num_output_tokens) / 2 for r in reqs)
    return max(1, int(total / len(reqs)))


def clock_summary(step_time: StepTimeModel, result: SimResult | None = None
                  ) -> dict[str, Any]:
    """What timed a run, for the report: the clock's name and description, its
    constants, and (roofline, with ``result``) the seconds per term and the dominant one."""
    if not isinstance(step_time, RooflineStepModel):
        return {
            "clock": "linear",
            "description": (f"linear: {step_time.step_overhead_s * 1e3:g} ms per step + "
                            f"{step_time.prefill_token_s * 1e6:g} µs per prefill token + "
                            f"{step_time.decode_seq_s * 1e3:g} ms per decoding sequence"),
            "dominant": None,
        }
    out: dict[str, Any] = {
        "clock": "roofline",
        "description": step_time.describe(),
        "model": step_time.shape.name, "gpu": step_time.gpu.name, "tp": step_time.shape.tp,
        "constants": step_time.constants.name,
        "decode_step_s": step_time.step_time_s(0, 1),
        "prefill_token_s": step_time.prefill_token_s,
        "dominant": None,
    }
    terms = result.clock_terms_s if result is not None else []
    total = sum(terms)
    if terms and total > 0:
        out["terms_s"] = dict(zip(TERMS, terms, strict=True))
        out["dominant"] = TERMS[max(range(len(terms)), key=terms.__getitem__)]
        out["dominant_share"] = max(terms) / total
    return out
