"""The simulator's clock: how long an engine step takes.

* :mod:`~pagedkv.sim.clock.roofline` — the roofline clock (the default whenever the model
  is known): weights, FLOPs, each KV-cache kind's reads from the step's real batch,
  tensor-parallel all-reduces and host overheads;
* :mod:`~pagedkv.sim.clock.shape` — the model as the clock sees it (planner readers);
* :mod:`~pagedkv.sim.clock.constants` — named constant sets and calibration files;
* :mod:`~pagedkv.sim.clock.calibrate` — ``--calibrate``: constants fitted to measured
  ``vllm bench serve`` / GuideLLM results;
* :mod:`~pagedkv.sim.clock.validation` — published measurements the clock is checked on.

The GPU table is :mod:`pagedkv.planner.gpus` (the planner sizes memory from it too). The
linear model (:class:`pagedkv.sim.StepTimeModel`) stays for reference runs
(``--step-model linear``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pagedkv.errors import InvalidArgumentError
from pagedkv.planner.gpus import resolve_gpu
from pagedkv.sim.clock.constants import CONSTANT_SETS, ClockConstants, load_constants
from pagedkv.sim.clock.roofline import TERMS, RooflineStepModel
from pagedkv.sim.clock.shape import ModelShape, model_shape
from pagedkv.sim.scheduler import StepTimeModel
from pagedkv.sim.workloads import Workload

if TYPE_CHECKING:
    from pagedkv.sim.api import SimConfig
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
    "with_clock",
]

STEP_MODELS = ("auto", "roofline", "linear")


def typical_context(workload: Workload) -> int:
    """Mean context a decoding request has: prompt + half its output, over requests."""
    reqs = workload.requests
    if not reqs:
        return 1
    total = sum(r.num_prompt_tokens + max(1, r.num_output_tokens) / 2 for r in reqs)
    return max(1, int(total / len(reqs)))


def with_clock(config: SimConfig, workload: Workload) -> SimConfig:
    """``config`` with its scheduler's step time resolved: the roofline clock of
    ``config.model`` (default the planner's default model) on ``config.gpu`` with
    ``config.calibration``'s constants — unless ``step_model`` is "linear", the pool is
    a bare ``num_blocks`` (no model), or the linear model's figures were changed ("auto").
    Idempotent.

    Raises:
        InvalidArgumentError: ``step_model`` "roofline" without a model, an unknown GPU
            or constant set.
        InputFileError, ConfigError: a bad GPU spec or calibration file; a model whose
            size cannot be derived.
    """
    sched = config.scheduler
    if isinstance(sched.step_time, RooflineStepModel):
        return config
    mode = config.step_model
    if mode not in STEP_MODELS:
        raise InvalidArgumentError(f"--step-model must be one of {', '.join(STEP_MODELS)}, "
                                   f"got {mode!r}")
    if mode == "roofline" and config.num_blocks is not None:
        raise InvalidArgumentError("the roofline clock needs the model: give --model "
                                   "instead of --num-blocks, or --step-model linear")
    gpu = resolve_gpu(config.gpu)  # checks --gpu even for the linear model
    constants = load_constants(config.calibration)
    if mode == "linear" or config.num_blocks is not None or (
            mode == "auto" and sched.step_time != StepTimeModel()):
        return config
    from pagedkv.sim.models import DEFAULT_MODEL

    shape = model_shape(config.model or DEFAULT_MODEL, tp=config.tp)
    clock = RooflineStepModel.build(shape, gpu, constants,
                                    typical_context_tokens=typical_context(workload))
    return replace(config, scheduler=replace(sched, step_time=clock))


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
