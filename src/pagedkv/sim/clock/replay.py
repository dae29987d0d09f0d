"""Replay measured requests on the simulator: the model ``--calibrate`` fits.

A measured benchmark ran its requests as ``C`` closed-loop streams (``vllm bench serve
--max-concurrency C``, GuideLLM's concurrent strategy: a stream sends its next request
when the previous one finished) or all at once (request rate "inf"). The replay runs the
same requests, in the file's order, the same way through the simulator's engine — its
scheduler, chunked prefill, token budget and the roofline clock — and reads each
request's simulated TTFT and TPOT back. Where the file records when each request was sent
(``Measured.sent_s``), the streams start when theirs did. Otherwise they start together,
as the benchmark starts them, and answers of different lengths spread them; streams of
identical requests start spread over one request's life instead (a real benchmark's
streams drift apart; simulated ones would stay in lockstep and prefill together). A
:class:`~pagedkv.sim.clock.measured.Measured` that stands for ``count`` identical requests
(an aggregate-only result file) is replayed as that many.

Worked case: two streams of one request each (so both start at once and prefill in
one step), Llama-3.1-8B on an H100::

    >>> from pagedkv.planner.gpus import find_gpu
    >>> from pagedkv.sim.clock.constants import CONSTANT_SETS
    >>> from pagedkv.sim.clock.measured import Measured
    >>> m = Measured(input_tokens=512, output_tokens=64, concurrency=2, ttft_s=0.02,
    ...              tpot_s=0.006)
    >>> setup = ReplaySetup(model="Llama-3.1-8B", gpu=find_gpu("H100"))
    >>> [(round(t * 1e3, 1), round(p * 1e3, 2)) for t, p in
    ...  replay_times([m, m], setup, CONSTANT_SETS["default"])]
    [(26.6, 6.12), (26.6, 6.12)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedkv.planner.gpus import GpuSpec
from pagedkv.sim.clock.constants import ClockConstants
from pagedkv.sim.clock.measured import Measured
from pagedkv.sim.workloads import SimRequest, Workload

__all__ = ["ReplaySetup", "replay_times"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySetup:
    """The deployment a measurement ran on: ``model`` (bundled name or ``config.json``
    path), GPU, TP, and the engine's ``--max-num-batched-tokens`` / ``--max-num-seqs``."""

    model: str
    gpu: GpuSpec
    tp: int = 1
    token_budget: int = 8192
    max_running: int = 256


def replay_times(data: Sequence[Measured], setup: ReplaySetup, constants: ClockConstants
                 ) -> list[tuple[float | None, float | None]]:
    """Simulated (TTFT s, TPOT s) of every measured request (module docstring), in
    ``data``'s order; TPOT None for a request of one output token, TTFT None if the
    simulation never started it. Requests of one concurrency form one replayed run."""
    out: list[tuple[float | None, float | None]] = [(None, None)] * len(data)
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(data):
        groups.setdefault(m.concurrency, []).append(i)
    for concurrency, idxs in groups.items():
        times = _replay_group([data[i] for i in idxs], concurrency, setup, constants)
        for i, t in zip(idxs, times, strict=True):
            out[i] = t
    return out


def _expand(group: Sequence[Measured]) -> tuple[list[tuple[int, int]], list[int]]:
    """Every request's (input, output) with copies, and which measured entry each is."""
    lengths, owner = [], []
    for j, m in enumerate(group):
        for _ in range(max(1, m.count)):
            lengths.append((m.input_tokens, m.output_tokens))
            owner.append(j)
    return lengths, owner


def _replay_group(group: Sequence[Measured], concurrency: int, setup: ReplaySetup,
                  constants: ClockConstants) -> list[tuple[float | None, float | None]]:
    from pagedkv.sim.api import SimConfig, run
    from pagedkv.sim.clock import typical_context
    from pagedkv.sim.clock.roofline import RooflineStepModel
    from pagedkv.sim.clock.shape import model_shape
    from pagedkv.sim.scheduler import SchedulerConfig

    lengths, owner = _expand(group)
    streams = min(concurrency, len(lengths))
    starts = _recorded_starts(group, streams)
    wl = _workload(lengths, streams, stagger_s=0.0, starts_s=starts)
    clock = RooflineStepModel.build(model_shape(setup.model, tp=setup.tp), setup.gpu,
                                    constants, typical_context_tokens=typical_context(wl))
    if starts is None and streams < len(lengths) and len(set(lengths)) == 1:
        # closed loop of identical requests: spread the streams over one request's life
        mean_out = sum(o for _, o in lengths) / len(lengths)
        life_s = mean_out * clock.step_time_s(0, streams)
        wl = _workload(lengths, streams, stagger_s=life_s / streams)
    cfg = SimConfig(model=setup.model, gpu_memory=setup.gpu.memory, tp=setup.tp,
                    bounds=False, jobs=1,
                    scheduler=SchedulerConfig(max_running=setup.max_running,
                                              token_budget=setup.token_budget,
                                              step_time=clock))
    res = run(wl, cfg).result
    assert res is not None
    sums = [[0.0, 0, 0.0, 0] for _ in group]  # ttft sum, n, tpot sum, n
    for k, j in enumerate(owner):
        first, finish = res.first_token_s[k], res.finish_s[k]
        if first is None:
            continue
        acc = sums[j]
        acc[0] += first - res.arrival_s[k]
        acc[1] += 1
        n_out = lengths[k][1]
        if finish is not None and n_out > 1:
            acc[2] += (finish - first) / (n_out - 1)
            acc[3] += 1
    return [(a[0] / a[1] if a[1] else None, a[2] / a[3] if a[3] else None) for a in sums]


def _recorded_starts(group: Sequence[Measured], streams: int) -> list[float] | None:
    """When each stream's first request was sent (seconds from the first), if the file
    recorded every send time and no entry stands for several requests; else None."""
    if any(m.sent_s is None or m.count > 1 for m in group):
        return None
    firsts = [m.sent_s for m in group[:streams] if m.sent_s is not None]
    return [t - min(firsts) for t in firsts]


def _workload(lengths: Sequence[tuple[int, int]], streams: int, *, stagger_s: float,
              starts_s: Sequence[float] | None = None) -> Workload:
    reqs = []
    for k, (n_in, n_out) in enumerate(lengths):
        parent = k - streams if k >= streams else None
        start_s = k * stagger_s if starts_s is None or parent is not None else starts_s[k]
        reqs.append(SimRequest(request_id=f"m{k}", arrival_s=start_s if parent is None
                               else 0.0, num_prompt_tokens=n_in, num_output_tokens=n_out,
                               parent=parent))
    return Workload(name="measured-replay", requests=tuple(reqs),
                    description=f"{len(lengths)} measured requests, {streams} streams")
