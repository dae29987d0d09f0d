"""The clock's flags of ``pagedkv simulate`` and ``--calibrate``.

``--gpu NAME|SPEC.json`` (the clock's peaks and the planner's memory), ``--step-model``
(auto: the roofline clock whenever the model is known; linear: the fixed per-step /
per-token / per-sequence figures), ``--calibration SET|FILE`` (the roofline constants),
and ``--calibrate MEASURED...`` (fit the constants to measured results, write them with
``--save-calibration`` and stop).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pagedkv.cli_args import MAX_SECONDS, number_arg
from pagedkv.errors import InvalidArgumentError
from pagedkv.planner.gpus import DEFAULT_GPU, GPUS, resolve_gpu
from pagedkv.sim.clock import STEP_MODELS
from pagedkv.sim.clock.constants import CONSTANT_SETS, FITTED, load_constants, save_constants
from pagedkv.sim.scheduler import StepTimeModel

__all__ = ["add_clock_flags", "linear_step_time", "run_calibrate", "step_model_of"]

DEFAULT_CALIBRATION_FILE = "pagedkv-calibration.json"


# Step costs: finite, >= 0, at most 10^9 (pagedkv.cli_args); a bad value is a usage error.
_STEP_MS = number_arg("--step-overhead-ms", minimum=0, maximum=MAX_SECONDS)
_PREFILL_US = number_arg("--prefill-token-us", minimum=0, maximum=MAX_SECONDS)
_DECODE_US = number_arg("--decode-seq-us", minimum=0, maximum=MAX_SECONDS)


def add_clock_flags(e: Any) -> None:
    """Add the clock's flags to the argument group ``e``."""
    e.add_argument("--gpu", metavar="NAME|SPEC.json",
                   help=f"the GPU: one of {', '.join(GPUS)} (default {DEFAULT_GPU}), or a "
                   "JSON spec; sets the clock's peaks and, without --gpu-memory, the memory")
    e.add_argument("--step-model", choices=STEP_MODELS, default=None,
                   help="auto (default): the roofline clock whenever the model is known "
                   "(not with --num-blocks); linear: the fixed per-step/token/sequence costs")
    e.add_argument("--calibration", metavar="SET|FILE",
                   help=f"roofline constants: {', '.join(CONSTANT_SETS)} (default 'default'), "
                   "or a file written by --calibrate")
    e.add_argument("--calibrate", nargs="+", metavar="MEASURED",
                   help="fit the roofline constants to `vllm bench serve` (--save-result "
                   "--save-detailed) or GuideLLM result files for --model/--gpu/--tp, "
                   "write them (--save-calibration) and stop")
    e.add_argument("--save-calibration", default=DEFAULT_CALIBRATION_FILE, metavar="FILE",
                   help=f"where --calibrate writes (default ./{DEFAULT_CALIBRATION_FILE})")
    d = StepTimeModel()
    e.add_argument("--step-overhead-ms", type=_STEP_MS, default=None, metavar="MS",
                   help=f"linear step model: per step (default {d.step_overhead_s * 1e3:g} "
                   "ms; implies --step-model linear)")
    e.add_argument("--prefill-token-us", type=_PREFILL_US, default=None, metavar="US",
                   help=f"linear: per prefill token (default {d.prefill_token_s * 1e6:g} µs)")
    e.add_argument("--decode-seq-us", type=_DECODE_US, default=None, metavar="US",
                   help=f"linear: per decoding sequence (default {d.decode_seq_s * 1e6:g} µs)")


def _linear_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, k) is not None
               for k in ("step_overhead_ms", "prefill_token_us", "decode_seq_us"))


def linear_step_time(args: argparse.Namespace) -> StepTimeModel:
    """The linear model of the flags (defaults where not given)."""
    d = StepTimeModel()
    return StepTimeModel(
        step_overhead_s=d.step_overhead_s if args.step_overhead_ms is None
        else args.step_overhead_ms / 1e3,
        prefill_token_s=d.prefill_token_s if args.prefill_token_us is None
        else args.prefill_token_us / 1e6,
        decode_seq_s=d.decode_seq_s if args.decode_seq_us is None
        else args.decode_seq_us / 1e6,
    )


def step_model_of(args: argparse.Namespace) -> str:
    """``--step-model``, with the linear flags implying "linear".

    Raises:
        InvalidArgumentError: linear figures with ``--step-model roofline``.
    """
    if _linear_given(args):
        if args.step_model == "roofline":
            raise InvalidArgumentError("--step-overhead-ms/--prefill-token-us/--decode-seq-us "
                                       "set the linear model: drop them or --step-model "
                                       "roofline")
        return "linear"
    return str(args.step_model or "auto")


def run_calibrate(args: argparse.Namespace) -> int:
    """``--calibrate``: fit, report the error before and after, write the file.

    Raises:
        InputFileError, InvalidArgumentError, ConfigError: bad measured files, GPU, model
            or start constants; nothing is written then.
    """
    from pagedkv.sim.clock.calibrate import fit_constants
    from pagedkv.sim.clock.measured import load_measured
    from pagedkv.sim.clock.shape import model_shape
    from pagedkv.sim.models import DEFAULT_MODEL

    if args.num_blocks is not None:
        raise InvalidArgumentError("--calibrate fits the roofline clock of a model: give "
                                   "--model (and --gpu, --tp), not --num-blocks")
    out = Path(args.save_calibration)
    if out.is_dir() or not out.parent.exists():
        raise InvalidArgumentError(f"--save-calibration {out}: not a writable file path; "
                                   "give a file in an existing directory")
    gpu = resolve_gpu(args.gpu)
    start = load_constants(args.calibration)
    shape = model_shape(args.model or DEFAULT_MODEL, tp=args.tp)
    data = [m for path in args.calibrate for m in load_measured(path)]
    fit = fit_constants(data, shape, gpu, start, name=out.stem)
    names = [Path(p).name for p in args.calibrate]
    figures: dict[str, object] = {"model": shape.name, "gpu": gpu.name, "tp": shape.tp,
               "measured_files": names,
               "requests": fit.num_requests, "mean_abs_error_before": fit.error_before,
               "mean_abs_error_after": fit.error_after, "start_constants": start.name}
    save_constants(fit.constants, out, fit=figures)
    if args.json:
        json.dump({"calibration_file": str(out), **figures,
                   "constants": {k: getattr(fit.constants, k) for k in FITTED}},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    c = fit.constants
    print(f"calibrated the roofline clock of {shape.name} TP {shape.tp} on {gpu.name} to "
          f"{fit.num_requests:,} measured requests ({', '.join(names)})")
    print(f"  TTFT/TPOT mean absolute error: {100 * fit.error_before:.1f} % with "
          f"'{start.name}' -> {100 * fit.error_after:.1f} % fitted")
    print(f"  hbm_efficiency {c.hbm_efficiency:.3f}, compute_utilization "
          f"{c.compute_utilization:.3f}, step_overhead {c.step_overhead_s * 1e3:.3f} ms, "
          f"seq_overhead {c.seq_overhead_s * 1e6:.1f} µs, layer_overhead "
          f"{c.layer_overhead_s * 1e6:.2f} µs")
    print(f"written to {out.resolve()}; use it with --calibration {out}")
    return 0
