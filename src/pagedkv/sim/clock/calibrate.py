"""``--calibrate``: fit the roofline clock's constants to measured requests.

The measurement model of a closed-loop benchmark at concurrency ``C`` (what
``vllm bench serve --max-concurrency C`` and GuideLLM's concurrent strategy run), for a
request of ``i`` input and ``o`` output tokens, decoding at context ``c = i + o/2``::

    TTFT = P      the step that prefills it beside C-1 decodes (one per 8,192-token chunk)
    TPOT = D + min(C-1, o-1) x (P - D) / (o-1)
           D: a decode step of C sequences; the other C-1 requests each prefill once
           during its life, and that step is a prefill step P instead of D

Every step time is linear in ``theta = (1/e, 1/u, step, seq)`` once it is known
which roofline term wins each max(), so the fit is Gauss-Newton on the relative errors
of TTFT and TPOT: solve the 4x4 normal equations ``(J^T J + lambda I) d = J^T r``
(``lambda`` keeps a direction the data cannot see at its start value), step, repeat
until the step is tiny. Constants stay in range (``e``, ``u`` <= 1, overheads >= 0).

>>> from pagedkv.planner.gpus import find_gpu
>>> from pagedkv.sim.clock.shape import model_shape
>>> shape, gpu = model_shape("Llama-3.1-8B"), find_gpu("H100")
>>> truth = CONSTANT_SETS["default"].with_values({"hbm_efficiency": 0.7}, name="truth")
>>> data = synthetic_measurements(shape, gpu, truth, shapes=[(1024, 128, 1), (8192, 64, 4)])
>>> fit = fit_constants(data, shape, gpu)
>>> round(fit.constants.hbm_efficiency, 3), fit.error_after < 1e-6 < fit.error_before
(0.7, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedkv.errors import InvalidArgumentError
from pagedkv.planner.gpus import GpuSpec
from pagedkv.sim.clock.constants import CONSTANT_SETS, ClockConstants
from pagedkv.sim.clock.measured import Measured
from pagedkv.sim.clock.roofline import RooflineStepModel
from pagedkv.sim.clock.shape import ModelShape

__all__ = ["Fit", "fit_constants", "mean_abs_error", "predict", "synthetic_measurements"]

CHUNK_TOKENS = 8192
#: Fitted: 1/e, 1/u, step and sequence overheads (the per-layer overhead is not: with one
#: model it cannot be told from the per-step one, so it keeps its set's value).
_N = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """Fitted constants and the mean absolute relative error of TTFT and TPOT over the
    measured requests before (start constants) and after the fit."""

    constants: ClockConstants
    error_before: float
    error_after: float
    num_requests: int
    iterations: int


def predict(shape: ModelShape, gpu: GpuSpec, constants: ClockConstants, *,
            input_tokens: int, output_tokens: int, concurrency: int) -> tuple[float, float]:
    """(TTFT, TPOT) of one request by the measurement model (module docstring)."""
    clock = RooflineStepModel(shape=shape, gpu=gpu, constants=constants)
    ctx = input_tokens + output_tokens // 2
    others = [ctx] * (concurrency - 1)
    prefill_s = 0.0
    done = 0
    while done < input_tokens:
        n = min(CHUNK_TOKENS, input_tokens - done)
        prefill_s += clock.time_of(decode_contexts=others, prefill_chunks=[(done, n)])
        done += n
    decode_s = clock.time_of(decode_contexts=[ctx] * concurrency, prefill_chunks=())
    gaps = output_tokens - 1
    if gaps <= 0:
        return prefill_s, decode_s
    first = clock.time_of(decode_contexts=others, prefill_chunks=[(0, min(input_tokens,
                                                                          CHUNK_TOKENS))])
    tpot = decode_s + min(concurrency - 1, gaps) * max(first - decode_s, 0.0) / gaps
    return prefill_s, tpot


def _keyed(data: Sequence[Measured]) -> dict[tuple[int, int, int], list[Measured]]:
    out: dict[tuple[int, int, int], list[Measured]] = {}
    for m in data:
        out.setdefault((m.input_tokens, m.output_tokens, m.concurrency), []).append(m)
    return out


def mean_abs_error(data: Sequence[Measured], shape: ModelShape, gpu: GpuSpec,
                   constants: ClockConstants) -> float:
    """Mean |predicted - measured| / measured over every TTFT and TPOT."""
    errors = _residuals(_keyed(data), shape, gpu, constants)
    return sum(abs(e) for e in errors) / len(errors) if errors else 0.0


def _residuals(keyed: dict[tuple[int, int, int], list[Measured]], shape: ModelShape,
               gpu: GpuSpec, constants: ClockConstants) -> list[float]:
    out = []
    for (i, o, c), group in keyed.items():
        ttft, tpot = predict(shape, gpu, constants, input_tokens=i, output_tokens=o,
                             concurrency=c)
        for m in group:
            if m.ttft_s > 0:
                out.append((ttft - m.ttft_s) / m.ttft_s)
            if m.tpot_s:
                out.append((tpot - m.tpot_s) / m.tpot_s)
    return out


def _theta(c: ClockConstants) -> list[float]:
    return [1.0 / c.hbm_efficiency, 1.0 / c.compute_utilization, c.step_overhead_s,
            c.seq_overhead_s]


def _constants(base: ClockConstants, theta: Sequence[float], name: str) -> ClockConstants:
    return base.with_values({
        "hbm_efficiency": 1.0 / max(theta[0], 1.0),
        "compute_utilization": 1.0 / max(theta[1], 1.0),
        "step_overhead_s": max(theta[2], 0.0), "seq_overhead_s": max(theta[3], 0.0)},
        name=name)


def _clamp(theta: list[float]) -> list[float]:
    return [max(theta[0], 1.0), max(theta[1], 1.0), *(max(t, 0.0) for t in theta[2:])]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting of a small dense system."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            continue
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        if abs(m[r][r]) < 1e-300:
            continue
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def fit_constants(data: Sequence[Measured], shape: ModelShape, gpu: GpuSpec,
                  start: ClockConstants | None = None, *, name: str = "calibrated",
                  max_iterations: int = 30) -> Fit:
    """Least-squares constants (module docstring) for ``data``, from ``start``.

    Raises:
        InvalidArgumentError: no measured request.
    """
    if not data:
        raise InvalidArgumentError("--calibrate: no measured request to fit to")
    base = start or CONSTANT_SETS["default"]
    keyed = _keyed(data)
    theta = _theta(base)
    scale = [abs(t) if t else 1e-5 for t in theta]  # finite-difference and ridge scales
    before = mean_abs_error(data, shape, gpu, base)
    r = _residuals(keyed, shape, gpu, base)
    it = 0
    for it in range(1, max_iterations + 1):  # noqa: B007 (reported)
        cols = []
        for j in range(_N):
            t2 = theta[:]
            t2[j] += scale[j] * 1e-4
            r2 = _residuals(keyed, shape, gpu, _constants(base, t2, name))
            cols.append([(x2 - x) / (scale[j] * 1e-4) for x, x2 in zip(r, r2, strict=True)])
        # normal equations in scaled variables, with a small ridge
        jtj = [[sum(cols[a][k] * cols[b][k] for k in range(len(r))) * scale[a] * scale[b]
                for b in range(_N)] for a in range(_N)]
        ridge = 1e-9 * max(sum(jtj[a][a] for a in range(_N)), 1e-12)
        for a in range(_N):
            jtj[a][a] += ridge
        jtr = [-sum(cols[a][k] * r[k] for k in range(len(r))) * scale[a] for a in range(_N)]
        step = _solve(jtj, jtr)
        found = _line_search(keyed, shape, gpu, base, name, theta, step, scale, r)
        if found is None:
            break  # no step along the direction does better: keep the last
        new, r_new = found
        moved = max(abs(new[a] - theta[a]) / scale[a] for a in range(_N))
        theta, r = new, r_new
        if moved < 1e-9:
            break
    fitted = _constants(base, theta, name)
    return Fit(constants=fitted, error_before=before,
               error_after=mean_abs_error(data, shape, gpu, fitted), num_requests=len(data),
               iterations=it)


def _line_search(keyed: dict[tuple[int, int, int], list[Measured]], shape: ModelShape,
                 gpu: GpuSpec, base: ClockConstants, name: str, theta: list[float],
                 step: list[float], scale: list[float], r: list[float],
                 ) -> tuple[list[float], list[float]] | None:
    """The full Gauss-Newton step, or the first of its halvings (up to 2^-30) that lowers
    the sum of squared residuals: the step times are piecewise linear (each max() picks
    a term), so a full step can cross a kink and overshoot. None when none lowers it."""
    sse = sum(x * x for x in r)
    factor = 1.0
    for _ in range(31):
        new = _clamp([theta[a] + factor * step[a] * scale[a] for a in range(_N)])
        r_new = _residuals(keyed, shape, gpu, _constants(base, new, name))
        if sum(x * x for x in r_new) < sse:
            return new, r_new
        factor /= 2
    return None


def synthetic_measurements(shape: ModelShape, gpu: GpuSpec, constants: ClockConstants, *,
                           shapes: Sequence[tuple[int, int, int]]) -> list[Measured]:
    """Requests measured as the model predicts them with ``constants`` (a round-trip
    test's data): one per ``(input, output, concurrency)``."""
    out = []
    for i, o, c in shapes:
        ttft, tpot = predict(shape, gpu, constants, input_tokens=i, output_tokens=o,
                             concurrency=c)
        out.append(Measured(input_tokens=i, output_tokens=o, concurrency=c, ttft_s=ttft,
                            tpot_s=tpot))
    return out


