"""``--calibrate``: fit the roofline clock's constants to measured requests.

The model fitted is the simulator itself: :func:`~pagedkv.sim.clock.replay.replay_times`
runs the measured requests the way the benchmark ran them (closed-loop streams at its
concurrency, or all at once) through the engine with the roofline clock, and reads every
request's TTFT and TPOT back. The fit is Gauss-Newton on the relative errors of those
against the measured ones, over ``theta = (1/e, 1/u, step, seq, request latency)``:
forward differences for the Jacobian, the 5x5 normal equations
``(J^T J + lambda I) d = J^T r`` in pure Python (``lambda`` keeps a direction nothing sees
at its start value), a step halved until it lowers the sum of squares (each roofline
max() is a kink a full step can cross), a weak prior toward the start constants
(:class:`_Problem`) and more starts: the request latency that closes the median TTFT
gap, the step overhead that closes the median TPOT gap, and both. Constants stay in
range (``e``, ``u`` <= 1, overheads >= 0).

>>> from pagedkv.planner.gpus import find_gpu
>>> from pagedkv.sim.clock.replay import ReplaySetup
>>> setup = ReplaySetup(model="Llama-3.1-8B", gpu=find_gpu("H100"))
>>> truth = CONSTANT_SETS["default"].with_values({"hbm_efficiency": 0.7}, name="truth")
>>> data = synthetic_measurements(setup, truth, shapes=[(1024, 128, 1), (8192, 64, 4)])
>>> fit = fit_constants(data, setup)
>>> round(fit.constants.hbm_efficiency, 2), fit.error_after < 1e-3 < fit.error_before
(0.7, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedkv.errors import InvalidArgumentError
from pagedkv.sim.clock.constants import CONSTANT_SETS, ClockConstants
from pagedkv.sim.clock.measured import Measured
from pagedkv.sim.clock.replay import ReplaySetup, replay_times

__all__ = ["Fit", "fit_constants", "mean_abs_error", "synthetic_measurements"]

#: Fitted: 1/e, 1/u, step and sequence overheads, request latency (the per-layer
#: overhead is not: with one model it cannot be told from the per-step one, so it keeps
#: its set's value).
_N = 5
#: theta's index of the request latency.
_LATENCY = 4
#: Relative size of a forward-difference step (the replay is piecewise smooth in theta).
_FD = 1e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """Fitted constants and the mean absolute relative error of TTFT and TPOT over the
    measured requests before (start constants) and after the fit."""

    constants: ClockConstants
    error_before: float
    error_after: float
    num_requests: int
    iterations: int


def mean_abs_error(data: Sequence[Measured], setup: ReplaySetup,
                   constants: ClockConstants) -> float:
    """Mean |simulated - measured| / measured over every measured TTFT and TPOT."""
    errors = _residuals(data, setup, constants)
    return sum(abs(e) for e in errors) / len(errors) if errors else 0.0


def _residuals(data: Sequence[Measured], setup: ReplaySetup, constants: ClockConstants
               ) -> list[float]:
    out = []
    for m, (ttft, tpot) in zip(data, replay_times(data, setup, constants), strict=True):
        if m.ttft_s > 0:
            out.append((ttft - m.ttft_s) / m.ttft_s if ttft is not None else 1.0)
        if m.tpot_s:
            out.append((tpot - m.tpot_s) / m.tpot_s if tpot is not None else 1.0)
    return out


def _theta(c: ClockConstants) -> list[float]:
    return [1.0 / c.hbm_efficiency, 1.0 / c.compute_utilization, c.step_overhead_s,
            c.seq_overhead_s, c.request_latency_s]


def _constants(base: ClockConstants, theta: Sequence[float], name: str) -> ClockConstants:
    return base.with_values({
        "hbm_efficiency": 1.0 / max(theta[0], 1.0),
        "compute_utilization": 1.0 / max(theta[1], 1.0),
        "step_overhead_s": max(theta[2], 0.0), "seq_overhead_s": max(theta[3], 0.0),
        "request_latency_s": max(theta[4], 0.0)}, name=name)


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


def fit_constants(data: Sequence[Measured], setup: ReplaySetup,
                  start: ClockConstants | None = None, *, name: str = "calibrated",
                  max_iterations: int = 20) -> Fit:
    """Least-squares constants (module docstring) for ``data`` run on ``setup``, from
    ``start``.

    Raises:
        InvalidArgumentError: no measured request.
    """
    if not data:
        raise InvalidArgumentError("--calibrate: no measured request to fit to")
    base = start or CONSTANT_SETS["default"]
    fit = _fit_from(data, setup, base, name, max_iterations)
    # more starts: the request latency that closes the median TTFT gap, the step
    # overhead that closes the median TPOT gap, and both (a TTFT or TPOT the steps cannot
    # explain otherwise pulls the GPU constants off, and a step that moves every roofline
    # term at once crosses kinks Gauss-Newton stops at); the best fit is kept. The
    # replayed figures already count the start's constants: a gap comes on top of them.
    ttft_gap, tpot_gap = _median_gaps(data, setup, base)
    starts = []
    if ttft_gap > 0 and base.request_latency_s > 0:
        starts.append({"request_latency_s": base.request_latency_s + ttft_gap})
    if tpot_gap > 0:
        starts.append({"step_overhead_s": base.step_overhead_s + tpot_gap})
    if len(starts) == 2:
        starts.append(starts[0] | starts[1])
    for values in starts:
        other = _fit_from(data, setup, base.with_values(values, name=base.name), name,
                          max_iterations)
        if other.error_after < fit.error_after:
            fit = replace(other, error_before=fit.error_before)
    return fit


def _median_gaps(data: Sequence[Measured], setup: ReplaySetup, base: ClockConstants
                 ) -> tuple[float, float]:
    """Median (measured - replayed) TTFT and TPOT with ``base`` (seconds; 0 if none)."""
    ttft, tpot = [], []
    for m, (t, p) in zip(data, replay_times(data, setup, base), strict=True):
        if m.ttft_s > 0 and t is not None:
            ttft.append(m.ttft_s - t)
        if m.tpot_s and p is not None:
            tpot.append(m.tpot_s - p)
    return (sorted(ttft)[len(ttft) // 2] if ttft else 0.0,
            sorted(tpot)[len(tpot) // 2] if tpot else 0.0)


def _fit_from(data: Sequence[Measured], setup: ReplaySetup, base: ClockConstants,
              name: str, max_iterations: int) -> Fit:
    prob = _Problem(data, setup, base, name)
    theta = prob.theta0
    r = prob.residuals(theta)
    before = prob.error(r)
    it = 0
    for it in range(1, max_iterations + 1):  # noqa: B007 (reported)
        step = _gauss_newton_step(prob, theta, r)
        found = _line_search(prob, theta, step, r)
        if found is None:
            break  # no step along the direction does better: keep the last
        new, r_new = found
        moved = max(abs(new[a] - theta[a]) / prob.scale[a] for a in range(_N))
        theta, r = new, r_new
        if moved < 1e-7:
            break
    return Fit(constants=prob.constants(theta), error_before=before,
               error_after=prob.error(r), num_requests=sum(m.count for m in data),
               iterations=it)


class _Problem:
    """The residuals the fit minimises: the data's relative errors, then one prior term
    per constant, ``PRIOR x (theta - theta0) / scale``, which keeps a constant the data
    cannot see at its start value (a 100 % move costs what a 0.1 % data error does:
    negligible wherever the data can tell, so known constants are recovered)."""

    PRIOR = 0.001

    def __init__(self, data: Sequence[Measured], setup: ReplaySetup, base: ClockConstants,
                 name: str) -> None:
        self.data, self.setup, self.base, self.name = data, setup, base, name
        self.theta0 = _theta(base)
        # scales: a constant at 0 moves on a scale of 10 µs (overheads) or 20 ms (latency)
        self.scale = [abs(t) if t else d for t, d in
                      zip(self.theta0, (1.0, 1.0, 1e-5, 1e-5, 0.02), strict=True)]
        self.num_data = 0
        #: a start without request latency keeps none (an engine driven in-process, the
        #: ``offline`` set: no API server between client and engine): not fitted
        self.held = {_LATENCY} if base.request_latency_s == 0 else set()

    def constants(self, theta: Sequence[float]) -> ClockConstants:
        return _constants(self.base, theta, self.name)

    def residuals(self, theta: Sequence[float]) -> list[float]:
        r = _residuals(self.data, self.setup, self.constants(theta))
        self.num_data = len(r)
        return r + [self.PRIOR * (theta[a] - self.theta0[a]) / self.scale[a]
                    for a in range(_N)]

    def error(self, r: Sequence[float]) -> float:
        """Mean absolute relative error of the data part of ``r``."""
        n = self.num_data
        return sum(abs(x) for x in r[:n]) / n if n else 0.0


def _gauss_newton_step(prob: _Problem, theta: list[float], r: list[float]) -> list[float]:
    """The Gauss-Newton step in scaled variables (forward-difference Jacobian, a small
    ridge for a direction nothing sees)."""
    scale = prob.scale
    cols = []
    for j in range(_N):
        if j in prob.held:  # a zero column: the ridge keeps its step at 0
            cols.append([0.0] * len(r))
            continue
        t2 = theta[:]
        t2[j] += scale[j] * _FD
        r2 = prob.residuals(t2)
        cols.append([(x2 - x) / (scale[j] * _FD) for x, x2 in zip(r, r2, strict=True)])
    jtj = [[sum(cols[a][k] * cols[b][k] for k in range(len(r))) * scale[a] * scale[b]
            for b in range(_N)] for a in range(_N)]
    ridge = 1e-9 * max(sum(jtj[a][a] for a in range(_N)), 1e-12)
    for a in range(_N):
        jtj[a][a] += ridge
    jtr = [-sum(cols[a][k] * r[k] for k in range(len(r))) * scale[a] for a in range(_N)]
    return _solve(jtj, jtr)


def _line_search(prob: _Problem, theta: list[float], step: list[float], r: list[float]
                 ) -> tuple[list[float], list[float]] | None:
    """The full Gauss-Newton step, or the first of its halvings (up to 2^-12) that lowers
    the sum of squared residuals: the step times are piecewise linear (each max() picks
    a term), so a full step can cross a kink and overshoot. None when none lowers it."""
    sse = sum(x * x for x in r)
    factor = 1.0
    for _ in range(13):
        new = _clamp([theta[a] + factor * step[a] * prob.scale[a] for a in range(_N)])
        r_new = prob.residuals(new)
        if sum(x * x for x in r_new) < sse:
            return new, r_new
        factor /= 2
    return None


def synthetic_measurements(setup: ReplaySetup, constants: ClockConstants, *,
                           shapes: Sequence[tuple[int, int, int]]) -> list[Measured]:
    """Requests measured as the replay gives them with ``constants`` (a round-trip
    test's data): per ``(input, output, concurrency)``, ``concurrency`` requests of that
    shape run as ``concurrency`` streams."""
    skeleton = [Measured(input_tokens=i, output_tokens=o, concurrency=c, ttft_s=1.0,
                         tpot_s=1.0) for i, o, c in shapes for _ in range(c)]
    out = []
    for m, (ttft, tpot) in zip(skeleton, replay_times(skeleton, setup, constants),
                               strict=True):
        out.append(replace(m, ttft_s=ttft or 0.0, tpot_s=tpot))
    return out
