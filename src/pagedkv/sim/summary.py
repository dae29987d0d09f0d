"""The typed report of a simulation (:class:`SimReport`) and the verdict on it.

:func:`pagedkv.sim.run` returns a :class:`SimReport`; the CLI only renders it
(:mod:`pagedkv.sim.report`). :meth:`SimReport.to_dict` is its JSON form (``--json``).

**Verdict** (engine mode), from the run's own evidence:

* ``saturated`` — requests queue or are preempted: queue delay p99 above
  :data:`SATURATED_QUEUE_S`, or any preemption. (A long TTFT without queueing is the
  prefill of long prompts, not saturation; the evidence shows it.) It says whether the
  KV cache is the limit (usage at its maximum, preemptions:
  more KV memory helps) or compute (the cache has room while requests wait: more
  replicas or faster steps help).
* ``idle`` — KV usage never above :data:`IDLE_USAGE` and nobody waits: a smaller GPU or
  more traffic per replica would do.
* ``healthy`` — neither.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pagedkv.sim.bounds import BoundResult
from pagedkv.sim.host_tier import HostRunStats, HostSweepRow
from pagedkv.sim.pure_cache import SweepRow
from pagedkv.sim.results import SimResult, percentile

__all__ = [
    "IDLE_USAGE",
    "SATURATED_QUEUE_S",
    "CapacityInfo",
    "EngineStats",
    "HitWindow",
    "Latency",
    "SimReport",
    "UsageSample",
    "Verdict",
    "build_report",
    "judge",
    "rejected_reasons",
    "searched",
]

#: Queue delay p99 above this (seconds) counts as saturated.
SATURATED_QUEUE_S = 1.0
#: KV usage never above this counts as idle.
IDLE_USAGE = 0.3
#: The end of every verdict advice: the CLI prints the command after it (``next:``).
FIND_CAPACITY_ADVICE = ("the next command searches the cheapest GPU, TP and replica count "
                        "meeting TTFT p99 2 s and TPOT p99 100 ms.")
#: The same end when the run has already searched and prints the answer under the verdict.
SEARCHED_ADVICE = ("the search below names the cheapest GPU, TP and replica count meeting "
                   "TTFT p99 2 s and TPOT p99 100 ms (next: repeats it).")


@dataclass(frozen=True, slots=True, kw_only=True)
class HitWindow:
    start_s: float
    end_s: float
    hit_rate: float


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageSample:
    time_s: float
    usage: float
    running: int
    waiting: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """Percentiles and the mean in seconds (None without samples)."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None = None

    @classmethod
    def of(cls, values: list[float]) -> Latency:
        return cls(p50=percentile(values, 50), p90=percentile(values, 90),
                   p99=percentile(values, 99),
                   mean=math.fsum(values) / len(values) if values else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
    """Engine-mode figures: steps, simulated time, KV usage, latency, preemptions."""

    steps: int
    simulated_s: float
    usage_mean: float | None
    usage_max: float | None
    queue_delay: Latency
    ttft: Latency
    max_waiting: int
    usage_over_time: tuple[UsageSample, ...]
    #: time per output token after the first, per request: (finish - first) / (out - 1)
    tpot: Latency = field(default_factory=lambda: Latency(p50=None, p90=None, p99=None))
    #: end-to-end latency, arrival to last token
    e2e: Latency = field(default_factory=lambda: Latency(p50=None, p90=None, p99=None))
    #: output tokens of finished requests per simulated second
    output_tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """``state``: "saturated", "healthy" or "idle"; ``evidence``: the figures behind it;
    ``advice``: what would change it (empty when nothing needs to)."""

    state: str
    evidence: str
    advice: str = ""
    limit: str | None = None  # "kv-cache" or "compute" when saturated


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityInfo:
    """Where the capacity came from and the KV-cache groups simulated."""

    source: str
    groups: tuple[str, ...]
    note: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SimReport:
    """Everything a run measured and what it means (rates are fractions, times seconds).

    ``warmup_requests``: index of the first request counted "after warm-up". Bounds are
    None when skipped; ``engine`` and ``verdict`` are None in pure-cache mode.
    ``result`` holds the raw per-request measurements.
    """

    workload: str
    description: str
    mode: str
    semantics: str
    block_size: int
    num_blocks: int
    capacity_tokens: int
    capacity: CapacityInfo
    settings: dict[str, Any]
    requests: int
    rejected_requests: int
    #: ``rejected_requests`` by reason: ``over_max_model_len`` (prompt + output longer
    #: than the engine's max_model_len: vLLM's server refuses them) and ``over_cache``
    #: (more blocks than the whole cache holds); empty in pure-cache mode.
    rejected_by_reason: dict[str, int]
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float | None
    warmup_requests: int
    hit_rate_after_warmup: float | None
    ideal_hit_rate: float | None
    infinite_cache_hit_rate: float | None
    infinite_cache_hit_rate_after_warmup: float | None
    belady_hit_rate: float | None
    belady_hit_rate_after_warmup: float | None
    evicted_blocks: int
    preemptions: int
    preempted_relookup_tokens: int
    preempted_relookup_hit_tokens: int
    hit_rate_windows: tuple[HitWindow, ...]
    wall_s: float
    engine: EngineStats | None = None
    verdict: Verdict | None = None
    sweep: tuple[SweepRow, ...] = ()
    #: ``--retention``: :meth:`pagedkv.sim.retention_support.RetentionComparison.to_dict`.
    retention: dict[str, Any] | None = None
    result: SimResult | None = field(default=None, repr=False, compare=False)
    #: The host tier's figures and host-size sweep (:mod:`pagedkv.sim.host_sweep`).
    host_tier: HostRunStats | None = None
    host_sweep: tuple[HostSweepRow, ...] = ()
    #: The clock that timed the run (:func:`pagedkv.sim.clock.clock_summary`); None in
    #: pure-cache mode.
    clock: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field but ``result``; engine figures at the top level."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            if name in ("result", "engine", "sweep", "capacity", "verdict",
                        "hit_rate_windows", "host_tier", "host_sweep"):
                continue
            out[name] = getattr(self, name)
        out["settings"] = {**self.settings, "capacity": asdict(self.capacity)}
        out["hit_rate_windows"] = [asdict(w) for w in self.hit_rate_windows]
        out["verdict"] = asdict(self.verdict) if self.verdict else None
        e = self.engine
        if e is not None:
            out.update(
                steps=e.steps, simulated_s=e.simulated_s, usage_mean=e.usage_mean,
                usage_max=e.usage_max, max_waiting=e.max_waiting,
                latency_s={"queue_delay_s": asdict(e.queue_delay), "ttft_s": asdict(e.ttft),
                           "tpot_s": asdict(e.tpot), "e2e_s": asdict(e.e2e)},
                output_tokens_per_s=e.output_tokens_per_s,
                usage_over_time=[asdict(u) for u in e.usage_over_time],
            )
        if self.sweep:
            out["capacity_sweep"] = [asdict(r) for r in self.sweep]
        if self.host_tier is not None:
            out["host_tier"] = asdict(self.host_tier)
        if self.host_sweep:
            out["host_sweep"] = [asdict(r) for r in self.host_sweep]
        return out


def _rate(hit: int, query: int) -> float | None:
    return hit / query if query else None


def _engine_stats(res: SimResult) -> EngineStats:
    usage = res.sample_usage
    arrivals = res.arrival_s
    queue = [s - a for a, s in zip(arrivals, res.first_scheduled_s, strict=True)
             if s is not None]
    ttft = [f - a for a, f in zip(arrivals, res.first_token_s, strict=True) if f is not None]
    tpot, e2e, out_tokens = _per_request(res)
    return EngineStats(
        tpot=Latency.of(tpot), e2e=Latency.of(e2e),
        output_tokens_per_s=out_tokens / res.sim_duration_s if res.sim_duration_s > 0 else None,
        steps=res.num_steps, simulated_s=res.sim_duration_s,
        usage_mean=sum(usage) / len(usage) if usage else None,
        usage_max=max(usage) if usage else None,
        queue_delay=Latency.of(queue), ttft=Latency.of(ttft),
        max_waiting=max(res.sample_waiting, default=0),
        usage_over_time=tuple(
            UsageSample(time_s=t, usage=u, running=r, waiting=w)
            for t, u, r, w in zip(res.sample_time_s, usage, res.sample_running,
                                  res.sample_waiting, strict=True)),
    )


def _per_request(res: SimResult) -> tuple[list[float], list[float], int]:
    """(TPOT of requests with 2+ output tokens, end-to-end latencies, output tokens) of
    the finished requests."""
    tpot: list[float] = []
    e2e: list[float] = []
    total = 0
    outs = res.output_tokens or [1] * len(res.finish_s)
    for a, first, end, n in zip(res.arrival_s, res.first_token_s, res.finish_s, outs,
                                strict=True):
        if end is None or first is None:
            continue
        e2e.append(end - a)
        total += n
        if n > 1:
            tpot.append((end - first) / (n - 1))
    return tpot, e2e, total


def judge(engine: EngineStats, *, preemptions: int, rejected: int,
          over_context: int = 0) -> Verdict:
    """The verdict on an engine run (module docstring); ``over_context`` of the
    ``rejected`` requests were longer than max_model_len, the rest than the cache."""
    queue99 = engine.queue_delay.p99 or 0.0
    usage_max = engine.usage_max or 0.0
    usage_mean = engine.usage_mean or 0.0
    figures = (f"KV usage mean {100 * usage_mean:.0f} % / max {100 * usage_max:.0f} %, "
               f"{preemptions:,} preemptions, queue delay p99 {_s(engine.queue_delay.p99)}, "
               f"TTFT p50 {_s(engine.ttft.p50)} / p99 {_s(engine.ttft.p99)}, up to "
               f"{engine.max_waiting:,} waiting")
    if rejected:
        figures += f", {rejected:,} rejected ({rejected_reasons(rejected, over_context)})"
    if queue99 > SATURATED_QUEUE_S or preemptions:
        kv_bound = preemptions > 0 or usage_max >= 0.98
        if kv_bound:
            advice = ("The KV cache is the limit: it needs more memory (a bigger GPU, TP) "
                      f"or more replicas; {FIND_CAPACITY_ADVICE}")
        else:
            advice = ("Compute is the limit (the cache has room while requests wait): it "
                      f"needs more replicas or faster steps; {FIND_CAPACITY_ADVICE}")
        return Verdict(state="saturated", evidence=figures, advice=advice,
                       limit="kv-cache" if kv_bound else "compute")
    if usage_max <= IDLE_USAGE and engine.max_waiting == 0:
        return Verdict(state="idle", evidence=figures,
                       advice=f"A smaller deployment may do; {FIND_CAPACITY_ADVICE}")
    return Verdict(state="healthy", evidence=figures)


def rejected_reasons(rejected: int, over_context: int) -> str:
    """``99 longer than max_model_len, 3 longer than the whole cache`` (the nonzero
    reasons of ``rejected`` requests, ``over_context`` of them longer than
    max_model_len)."""
    parts = [f"{n:,} {why}" for n, why in (
        (over_context, "longer than max_model_len"),
        (rejected - over_context, "longer than the whole cache")) if n]
    return ", ".join(parts) or "none"


def _s(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.1f} s"


def build_report(
    result: SimResult,
    *,
    description: str,
    semantics: str,
    capacity: CapacityInfo,
    warmup_start: int,
    bounds_warmup_start: int | None = None,
    infinite: BoundResult | None = None,
    belady: BoundResult | None = None,
    ideal_hit_rate: float | None = None,
    sweep: tuple[SweepRow, ...] = (),
    settings: dict[str, Any] | None = None,
    num_windows: int = 20,
) -> SimReport:
    """The report of ``result``. ``bounds_warmup_start``: the first "after warm-up"
    position in the bounds' request list (they leave rejected requests out)."""
    bw = warmup_start if bounds_warmup_start is None else bounds_warmup_start
    hit, query = result.totals()
    hit2, query2 = result.totals(warmup_start)
    engine = _engine_stats(result) if result.mode == "engine" else None
    over = result.rejected_over_context
    verdict = None if engine is None else judge(
        engine, preemptions=result.preemptions, rejected=result.rejected, over_context=over)
    return SimReport(
        workload=result.workload, description=description, mode=result.mode,
        semantics=semantics, block_size=result.block_size, num_blocks=result.num_blocks,
        capacity_tokens=result.capacity_tokens, capacity=capacity,
        settings=dict(settings or {}), requests=result.num_requests,
        rejected_requests=result.rejected, prompt_tokens=query, hit_tokens=hit,
        rejected_by_reason={} if engine is None else {
            "over_max_model_len": over, "over_cache": result.rejected - over},
        hit_rate=_rate(hit, query), warmup_requests=warmup_start,
        hit_rate_after_warmup=_rate(hit2, query2), ideal_hit_rate=ideal_hit_rate,
        infinite_cache_hit_rate=infinite.hit_rate() if infinite else None,
        infinite_cache_hit_rate_after_warmup=infinite.hit_rate(bw) if infinite else None,
        belady_hit_rate=belady.hit_rate() if belady else None,
        belady_hit_rate_after_warmup=belady.hit_rate(bw) if belady else None,
        evicted_blocks=result.evicted_blocks, preemptions=result.preemptions,
        preempted_relookup_tokens=result.preempted_query_tokens,
        preempted_relookup_hit_tokens=result.preempted_hit_tokens,
        hit_rate_windows=tuple(HitWindow(start_s=a, end_s=b, hit_rate=r)
                               for a, b, r in result.hit_rate_windows(num_windows)),
        wall_s=result.wall_s, engine=engine, verdict=verdict, sweep=sweep, result=result,
    )


def searched(report: SimReport) -> SimReport:
    """``report`` with its verdict's advice pointing to the search printed under it
    (:data:`SEARCHED_ADVICE`) instead of to the next command."""
    v = report.verdict
    if v is None or FIND_CAPACITY_ADVICE not in v.advice:
        return report
    return replace(report, verdict=replace(
        v, advice=v.advice.replace(FIND_CAPACITY_ADVICE, SEARCHED_ADVICE)))
