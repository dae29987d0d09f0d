"""``pagedkv simulate --find-capacity``: the cheapest deployment that meets an SLO.

The space: every GPU of the price table (``DEFAULT_PRICES_USD_PER_GPU_HOUR`` of
:mod:`pagedkv.sweep.rows`), tensor parallelism :data:`TP_CHOICES`, 1 to ``max_replicas``
replicas routed :data:`ROUTER` or :data:`WIDE_ROUTER`, and the KV memory the planner
gives the model on that GPU at the run's ``--gpu-memory-utilization`` (default 0.9) or at
:data:`WIDE_KV_FRACTION` (``--memory-scale`` as given). A deployment costs GPUs
(replicas x TP) x the GPU's price per hour. Each candidate is a sweep point
(:func:`pagedkv.sweep.point.run_point`: the engine ``simulate`` runs, N of them on one
clock) on the sweep's backends (local processes, or Ray), and meets the SLO when it
rejects nothing and its TTFT p99 and TPOT p99 are within the targets
(:class:`~pagedkv.sweep.rows.Slo`).

The search (bounded: at most ``max_points`` replays):

* per (GPU, TP) the smallest replica count that meets the SLO, found by doubling then
  bisecting (more replicas of the same engine never serve the same requests worse);
* pairs in order of their price per replica, and no candidate at or above the cheapest
  deployment found so far is replayed;
* a replay stops as soon as its TTFT p99 is sure to miss (``STOP_OPTION`` of
  :mod:`pagedkv.sweep.point`), so a hopeless candidate costs seconds.

* a pair is skipped without a replay when even an idle replica cannot meet the TTFT
  target: the p99 over requests of the time to prefill, alone, the prompt tokens no
  earlier request shares (an infinite cache's miss), chunked to the token budget and
  timed by the pair's clock, plus the request latency (:func:`alone_ttft_p99_s`). No
  replica count lowers it.

Then the search widens, only where that can change the answer: per (GPU, TP), its
costliest replayed miss cheaper than the answer is replayed again with the cache-aware
router (:data:`WIDE_ROUTER`; several replicas, and prompts that share prefixes) and with
:data:`WIDE_KV_FRACTION` of the GPU's memory as KV (when the miss preempted requests),
all in one batch on the backend (its workers run them at once). The cheapest variant
that meets becomes the answer: the same cost's run's own settings come first.

A pair the model does not fit (its replay raises) is dropped. The answer is the cheapest
deployment that met the SLO, with the next-cheaper one that was replayed and missed.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from pagedkv.sim.results import percentile
from pagedkv.sim.workloads import Workload, request_block_hashes
from pagedkv.sweep.backends import Backend, LocalBackend
from pagedkv.sweep.point import STOP_OPTION
from pagedkv.sweep.rows import DEFAULT_PRICES_USD_PER_GPU_HOUR, Slo

__all__ = ["DEFAULT_SLO", "ROUTER", "TP_CHOICES", "CapacityAnswer", "Deployment", "Tried",
           "find_deployment"]

#: Tensor-parallel sizes searched.
TP_CHOICES = (1, 2, 4)
#: The router of every searched deployment with more than one replica.
ROUTER = "least-loaded"
#: The SLO a default run's verdict searches for.
DEFAULT_SLO = Slo(ttft_p99_s=2.0, tpot_p99_ms=100.0)
#: The KV memory a widened candidate gets: this fraction of the GPU's memory (vLLM's
#: ``--gpu-memory-utilization``; the default is 0.9).
WIDE_KV_FRACTION = 0.95
#: The router a widened candidate of several replicas gets.
WIDE_ROUTER = "cache-aware"


@dataclass(frozen=True, slots=True, order=True)
class Deployment:
    """``replicas`` x ``gpu`` at tensor parallelism ``tp``, ``usd_per_hour`` in all,
    routed by ``router``, its KV memory the planner's at ``kv_fraction`` of the GPU's
    memory (None: the run's own ``--gpu-memory-utilization``). Ordered by cost, then the
    run's own settings (``widened`` 0) before a widened variant of the same cost."""

    usd_per_hour: float
    replicas: int
    tp: int
    gpu: str
    widened: int = 0
    router: str = ROUTER
    kv_fraction: float | None = None

    def options(self) -> dict[str, Any]:
        """Its ``simulate`` options (on top of the run's own)."""
        out: dict[str, Any] = {"gpu": self.gpu, "tp": self.tp, "replicas": self.replicas,
                               "router": self.router}
        if self.kv_fraction is not None:
            out["gpu_memory_utilization"] = self.kv_fraction
        return out

    def flags(self) -> list[str]:
        out = ["--gpu", self.gpu, "--tp", str(self.tp), "--replicas", str(self.replicas),
               "--router", self.router]
        if self.kv_fraction is not None:
            out += ["--gpu-memory-utilization", f"{self.kv_fraction:g}"]
        return out

    def describe(self) -> str:
        extra = []
        if self.router != ROUTER and self.replicas > 1:
            extra.append(self.router)
        if self.kv_fraction is not None:
            extra.append(f"KV at {self.kv_fraction:g} of GPU memory")
        return (f"{self.replicas} x {self.gpu}" + (f" TP {self.tp}" if self.tp > 1 else "")
                + (f" {', '.join(extra)}" if extra else "")
                + f" (${self.usd_per_hour:.2f}/h)")


@dataclass(frozen=True, slots=True)
class Tried:
    """One replayed candidate: its figures (None: it could not run, ``error``)."""

    deployment: Deployment
    metrics: Mapping[str, Any] | None
    error: str | None
    meets: bool

    def figures(self) -> str:
        m = self.metrics
        if m is None:
            return f"could not run ({self.error})"
        if m.get("stopped_early"):
            return "TTFT p99 over the target (stopped early)"
        ttft, tpot = m.get("ttft_p99_s"), m.get("tpot_p99_s")
        return (f"TTFT p99 {_s(ttft)}, TPOT p99 {_s(tpot, 1e3, 'ms')}, "
                f"TTFT mean {_s(m.get('ttft_mean_s'))}, rejected {m.get('rejected')}")


def _s(x: float | None, scale: float = 1.0, unit: str = "s") -> str:
    return "-" if x is None else f"{x * scale:.3g} {unit}"


@dataclass(frozen=True, slots=True)
class CapacityAnswer:
    """The search's answer: ``best`` (None: nothing searched met ``slo``), the
    next-cheaper replayed candidate that missed, everything replayed, and why the
    search ended."""

    slo: Slo
    best: Tried | None
    next_cheaper: Tried | None
    tried: tuple[Tried, ...]
    bounded: bool
    wall_s: float
    #: (GPU, TP, TTFT p99 lower bound in seconds or None) of every pair considered
    floors: tuple[tuple[str, int, float | None], ...] = ()

    def command(self, base_args: Sequence[str]) -> str | None:
        """The ``pagedkv simulate`` command that replays ``best`` alone."""
        if self.best is None:
            return None
        return shlex.join(["pagedkv", "simulate", *base_args, *self.best.deployment.flags()])

    def lines(self, base_args: Sequence[str]) -> list[str]:
        target = (f"TTFT p99 <= {self.slo.ttft_p99_s:g} s and TPOT p99 <= "
                  f"{self.slo.tpot_p99_ms:g} ms")
        head = f"find capacity ({len(self.tried)} deployments replayed in {self.wall_s:.0f} s"
        head += ", bounded)" if self.bounded else ")"
        if self.best is None:
            why = ("the search bound was reached first" if self.bounded else
                   f"none of {len(TP_CHOICES)} TP sizes x the priced GPUs x up to the "
                   "replica bound (nor their widened router and KV memory) meets it")
            known = [f for _, _, f in self.floors if f is not None]
            if known and len(known) == len(self.floors) and min(known) > self.slo.ttft_p99_s:
                why = (f"the prompts' prefill alone gives a TTFT p99 of at least "
                       f"{min(known):.3g} s on every priced GPU and TP size")
            return [f"{head}: no deployment meets {target}: {why}"]
        out = [f"{head}: cheapest deployment meeting {target}: "
               f"{self.best.deployment.describe()}: {self.best.figures()}",
               f"  reproduce: {self.command(base_args)}"]
        if self.next_cheaper is not None:
            out.append(f"  next cheaper replayed: {self.next_cheaper.deployment.describe()}: "
                       f"{self.next_cheaper.figures()}")
        return out

    def to_dict(self, base_args: Sequence[str]) -> dict[str, Any]:
        return {
            "slo": {"ttft_p99_s": self.slo.ttft_p99_s, "tpot_p99_ms": self.slo.tpot_p99_ms},
            "best": None if self.best is None else _tried(self.best),
            "command": self.command(base_args),
            "next_cheaper": None if self.next_cheaper is None else _tried(self.next_cheaper),
            "tried": [_tried(t) for t in self.tried], "bounded": self.bounded,
        }


def _tried(t: Tried) -> dict[str, Any]:
    d = t.deployment
    return {"gpu": d.gpu, "tp": d.tp, "replicas": d.replicas, "router": d.router,
            "kv_fraction": d.kv_fraction, "usd_per_hour": d.usd_per_hour,
            "meets_slo": t.meets, "error": t.error,
            "metrics": None if t.metrics is None else dict(t.metrics)}


def find_deployment(
    workload: Workload,
    base_options: Mapping[str, Any],
    slo: Slo = DEFAULT_SLO,
    *,
    prices: Mapping[str, float] | None = None,
    backend: Backend | None = None,
    max_replicas: int = 16,
    max_points: int = 48,
    log: Callable[[str], None] | None = None,
) -> CapacityAnswer:
    """Search (module docstring) the cheapest deployment for ``workload`` with
    ``base_options`` (``simulate`` options; their GPU, TP and replicas are searched)."""
    t0 = time.perf_counter()
    table = dict(prices if prices is not None else DEFAULT_PRICES_USD_PER_GPU_HOUR)
    run = backend or LocalBackend(jobs=1)
    say = log or (lambda _s: None)
    base = {k: v for k, v in base_options.items()
            if k not in ("gpu", "tp", "replicas", "router", "gpu_memory", "num_blocks")}
    tried: list[Tried] = []
    best: Tried | None = None
    pairs = sorted(((price * tp, gpu, tp) for gpu, price in table.items()
                    for tp in TP_CHOICES), key=lambda x: (x[0], x[2], x[1]))

    def replay(batch: list[Deployment]) -> list[Tried]:
        tasks = [(k, {**base, **d.options(), STOP_OPTION: slo.ttft_p99_s})
                 for k, d in enumerate(batch)]
        out = []
        for o in sorted(run.run(workload, tasks)):
            d = batch[o.index]
            meets = o.error is None and o.metrics is not None and slo.met(o.metrics)
            out.append(Tried(d, o.metrics, o.error, meets))
            say(f"find capacity: {d.describe()}: "
                f"{'meets' if meets else 'misses'} the SLO")
        tried.extend(out)
        return out

    floors: dict[tuple[str, int], float | None] = {}
    for unit, gpu, tp in pairs:
        if best is not None and unit >= best.deployment.usd_per_hour:
            break
        if len(tried) >= max_points:
            break
        floor = floors[gpu, tp] = alone_ttft_p99_s(workload, {**base, "gpu": gpu, "tp": tp})
        if floor is not None and floor > slo.ttft_p99_s:
            say(f"find capacity: {gpu} TP {tp}: prefill alone gives TTFT p99 >= "
                f"{floor:.3g} s, skipped")
            continue
        found = _smallest(partial(_deployment, unit, tp, gpu), replay, max_replicas, best,
                          lambda: len(tried) >= max_points)
        if found is not None and (best is None or found.deployment < best.deployment):
            best = found
    bounded = len(tried) >= max_points
    if not bounded:  # widen: the router and the KV memory of the misses below the answer
        own = base.get("gpu_memory_utilization") or 0.9
        wide = _widened(tried, best, own_kv_fraction=own,
                        shares_prefixes=_shares_prefixes(workload, base))
        if wide:
            say(f"find capacity: widening {len(wide)} missed deployments (router, KV memory)")
            hits = [t for t in replay(wide[:max_points - len(tried)]) if t.meets]
            if hits:
                best = min(hits, key=lambda t: t.deployment)
    nxt = None
    if best is not None:
        cheaper = [t for t in tried if not t.meets
                   and t.deployment.usd_per_hour < best.deployment.usd_per_hour]
        nxt = max(cheaper, key=lambda t: t.deployment, default=None)
    return CapacityAnswer(slo=slo, best=best, next_cheaper=nxt, tried=tuple(tried),
                          bounded=bounded, wall_s=time.perf_counter() - t0,
                          floors=tuple((g, t, f) for (g, t), f in floors.items()))


def _widened(tried: Sequence[Tried], best: Tried | None, *, own_kv_fraction: float,
              shares_prefixes: bool) -> list[Deployment]:
    """The variants worth a replay: per (GPU, TP), its costliest replayed miss cheaper
    than ``best`` (the only candidates whose variant could change the answer), with the
    cache-aware router (several replicas, and prompts that share prefixes: otherwise it
    routes as least-loaded does) and with :data:`WIDE_KV_FRACTION` of the GPU's memory
    as KV (when that is more than the run's own, and the miss preempted requests: the
    cache was a limit). Cheapest first."""
    limit = best.deployment.usd_per_hour if best is not None else float("inf")
    costliest: dict[tuple[str, int], Tried] = {}
    for t in tried:
        d = t.deployment
        if t.meets or t.metrics is None or d.widened or d.usd_per_hour >= limit:
            continue
        key = (d.gpu, d.tp)
        if key not in costliest or d.replicas > costliest[key].deployment.replicas:
            costliest[key] = t
    out = []
    for t in costliest.values():
        d = t.deployment
        if d.replicas > 1 and shares_prefixes:
            out.append(replace(d, widened=1, router=WIDE_ROUTER))
        if own_kv_fraction < WIDE_KV_FRACTION and (t.metrics or {}).get("preemptions"):
            out.append(replace(d, widened=2, kv_fraction=WIDE_KV_FRACTION))
    return sorted(out)


def _shares_prefixes(workload: Workload, options: Mapping[str, Any]) -> bool:
    """Whether an infinite cache would hit any prompt block (True when unknown)."""
    spans = _spans(workload, options.get("block_size") or 16)
    return spans is None or any(first > 0 for first, _ in spans)


def _uncached(workload: Workload, block_size: int) -> list[tuple[int, int]] | None:
    """(first uncached token, prompt tokens) per request under an infinite cache (None:
    token-id prompts, hashed by the manager)."""
    seen: set[bytes] = set()
    out = []
    for i, r in enumerate(workload.requests):
        hashes = request_block_hashes(r, block_size, index=i,
                                      source_block_size=workload.source_block_size)
        if hashes is None:
            return None
        hit = 0
        while hit < len(hashes) and hashes[hit] in seen:
            hit += 1
        seen.update(hashes)
        out.append((min(hit * block_size, r.num_prompt_tokens - 1), r.num_prompt_tokens))
    return out


_SPANS: dict[tuple[int, int], list[tuple[int, int]] | None] = {}


def _spans(workload: Workload, block_size: int) -> list[tuple[int, int]] | None:
    """:func:`_uncached`, kept for the one workload searched at a time."""
    key = (id(workload), block_size)
    if key not in _SPANS:
        _SPANS.clear()
        _SPANS[key] = _uncached(workload, block_size)
    return _SPANS[key]


def alone_ttft_p99_s(workload: Workload, options: Mapping[str, Any]) -> float | None:
    """A lower bound of the TTFT p99 ``options`` give on ``workload`` whatever the
    replica count (module docstring); None when it cannot be computed (no roofline
    clock, token-id prompts, a model that does not fit: the replay then decides)."""
    from pagedkv.errors import PagedKVError
    from pagedkv.sim.api import with_clock
    from pagedkv.sim.clock import RooflineStepModel
    from pagedkv.sweep.point import point_options, point_request

    try:
        config = with_clock(point_request(point_options({}, options)).config, workload)
    except PagedKVError:
        return None
    clock = config.scheduler.step_time
    if not isinstance(clock, RooflineStepModel):
        return None
    budget = config.scheduler.token_budget
    spans = _spans(workload, config.block_size)
    if spans is None:
        return None
    times: list[float] = []
    for ctx, end in spans:
        t = clock.request_latency_s
        while ctx < end:
            n = min(budget, end - ctx)
            t += clock.time_of(decode_contexts=[], prefill_chunks=[(ctx, n)])
            ctx += n
        times.append(t)
    return percentile(times, 99)


def _deployment(unit_usd_per_hour: float, tp: int, gpu: str, replicas: int) -> Deployment:
    return Deployment(unit_usd_per_hour * replicas, replicas, tp, gpu)


def _smallest(make: Callable[[int], Deployment], replay: Callable[[list[Deployment]],
              list[Tried]], max_replicas: int, best: Tried | None,
              exhausted: Callable[[], bool]) -> Tried | None:
    """The smallest replica count of one (GPU, TP) meeting the SLO below ``best``'s
    cost: doubling from 1, then bisecting between the last miss and the first hit."""
    low = 0  # the largest count known to miss
    hit: Tried | None = None
    n = 1
    while n <= max_replicas and not exhausted():
        d = make(n)
        if best is not None and d.usd_per_hour >= best.deployment.usd_per_hour:
            return None
        (t,) = replay([d])
        if t.metrics is None:
            return None  # the model does not fit this pair
        if t.meets:
            hit = t
            break
        low = n
        n = min(n * 2, max_replicas) if n < max_replicas else max_replicas + 1
    if hit is None:
        return None
    high = hit.deployment.replicas
    while high - low > 1 and not exhausted():
        mid = (low + high) // 2
        (t,) = replay([make(mid)])
        if t.meets:
            high, hit = mid, t
        else:
            low = mid
    return hit
