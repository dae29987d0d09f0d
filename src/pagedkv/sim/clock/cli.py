"""``pagedkv simulate --calibrate MEASURED...``: fit the roofline clock's constants to
measured results, write them (``--save-calibration``), print what the fit did and stop.
(The clock's options live in :mod:`pagedkv.sim.options`, their rules in
:mod:`pagedkv.sim.setup`.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pagedkv.errors import InvalidArgumentError
from pagedkv.planner.gpus import resolve_gpu
from pagedkv.sim.clock.constants import FITTED, load_constants, save_constants
from pagedkv.sim.options import DEFAULT_CALIBRATION_FILE
from pagedkv.sim.setup import CalibrateRequest

__all__ = ["DEFAULT_CALIBRATION_FILE", "run_calibrate"]


def run_calibrate(request: CalibrateRequest) -> int:
    """``--calibrate``: fit, report the error before and after, write the file.

    Raises:
        InputFileError, InvalidArgumentError, ConfigError: bad measured files, GPU, model
            or start constants; nothing is written then.
    """
    from pagedkv.sim.clock.calibrate import fit_constants
    from pagedkv.sim.clock.measured import load_measured
    from pagedkv.sim.clock.replay import ReplaySetup
    from pagedkv.sim.clock.shape import model_shape
    from pagedkv.sim.models import DEFAULT_MODEL

    if request.num_blocks is not None:
        raise InvalidArgumentError("--calibrate fits the roofline clock of a model: give "
                                   "--model (and --gpu, --tp), not --num-blocks")
    out = Path(request.save_to)
    if out.is_dir() or not out.parent.exists():
        raise InvalidArgumentError(f"--save-calibration {out}: not a writable file path; "
                                   "give a file in an existing directory")
    gpu = resolve_gpu(request.gpu)
    start = load_constants(request.calibration)
    model = request.model or DEFAULT_MODEL
    shape = model_shape(model, tp=request.tp)
    data = [m for path in request.measured for m in load_measured(path)]
    setup = ReplaySetup(model=model, gpu=gpu, tp=request.tp,
                        token_budget=request.token_budget, max_running=request.max_running)
    fit = fit_constants(data, setup, start, name=out.stem)
    names = [Path(p).name for p in request.measured]
    figures: dict[str, object] = {"model": shape.name, "gpu": gpu.name, "tp": shape.tp,
               "measured_files": names,
               "requests": fit.num_requests, "mean_abs_error_before": fit.error_before,
               "mean_abs_error_after": fit.error_after, "start_constants": start.name}
    save_constants(fit.constants, out, fit=figures)
    if request.json:
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
          f"seq_overhead {c.seq_overhead_s * 1e6:.1f} µs, request_latency "
          f"{c.request_latency_s * 1e3:.2f} ms (layer_overhead {c.layer_overhead_s * 1e6:.2f} "
          "µs kept)")
    print(f"written to {out.resolve()}; use it with --calibration {out}")
    return 0
