"""Published vLLM measurements the roofline clock is checked on, and the closed-loop
replays that reproduce their setups (``docs/simulator.md``, "The clock", has the table
and the sources; ``python -m pagedkv.sim.clock.validation`` prints it).

A point names the model, GPU, TP, request shape and concurrency of a published run and
the figure it reported: mean TPOT (ms), output tokens/s, or a ratio of two runs'
output tokens/s. :func:`simulate_point` replays the same shape on the simulator: ``C``
closed-loop streams (``vllm bench serve --max-concurrency C``: a request starts when
the previous one of its stream finishes), or everything at once (MLPerf offline).
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from pagedkv.planner.gpus import GpuSpec
from pagedkv.sim.clock.constants import CONSTANT_SETS, ClockConstants
from pagedkv.sim.workloads import SimRequest, Workload

__all__ = [
    "POINTS",
    "RTX_4090",
    "Point",
    "Run",
    "closed_loop",
    "eos_lengths",
    "setup_key",
    "simulate_point",
    "simulate_run",
]

#: Not in the table: given as a spec as any other GPU would be (NVIDIA Ada Lovelace
#: architecture whitepaper: 165.2 dense BF16 TFLOPS with FP32 accumulate, 1,008 GB/s).
RTX_4090 = GpuSpec(name="RTX-4090", bf16_tflops=165.2, fp8_tflops=330.3, hbm_tb_s=1.008,
                   memory_gib=24, interconnect_gb_s=32.0, source="Ada whitepaper")


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One benchmark run: ``model`` (bundled name; ``fp8``: FP8 weights), GPU, TP,
    request shape, ``concurrency`` (None: all requests at once, offline).

    ``lengths``: per-request (input, output) tokens when the run's requests differ (a
    replayed dataset; request ``i`` takes ``lengths[i % len(lengths)]``), else every
    request is ``input_tokens`` / ``output_tokens``. ``token_budget`` and ``max_running``
    are the engine's ``--max-num-batched-tokens`` and ``--max-num-seqs``."""

    model: str
    gpu: str | GpuSpec
    tp: int = 1
    input_tokens: int
    output_tokens: int
    concurrency: int | None
    num_requests: int
    fp8: bool = False
    lengths: tuple[tuple[int, int], ...] = ()
    token_budget: int = 8192
    max_running: int | None = None

    def request_lengths(self, i: int) -> tuple[int, int]:
        """(input, output) tokens of request ``i``."""
        if self.lengths:
            return self.lengths[i % len(self.lengths)]
        return self.input_tokens, self.output_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """A published figure: ``metric`` of ``run`` ("tpot_ms", "ttft_ms", "output_tok_s"),
    or with ``baseline`` the ratio of their output tokens/s; ``tolerance`` is the
    relative error the test allows."""

    name: str
    source: str
    run: Run
    metric: str
    measured: float
    tolerance: float
    baseline: Run | None = None


_MUSGRAVE = "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on"
_MLPERF = "MLPerf Inference v5.1 results, Llama-3.1-8B offline, vLLM submissions"
_RAHMAN = "https://mushfiqrahman.dev/?p=1668"


_GPUSTACK = ("GPUStack performance lab (github.com/gpustack/gpustack, docs/performance-lab/"
             "{}), vLLM 0.11.0, `vllm bench serve`")
_LAMBDA = ("Lambda vllm-benchmark (github.com/LambdaLabsML/vllm-benchmark, results/prompt_10/"
           "{}), vLLM 0.6, 10 ShareGPT prompts at once")
#: The 8 requests that completed in Lambda's 70B run (two of the 10 returned nothing).
_LAMBDA_70B = ((13, 120), (25, 770), (27, 233), (10, 194), (329, 101), (29, 741), (4, 6),
               (205, 63))
#: The same prompts on 2x A100 (other sampled answers).
_LAMBDA_70B_A100 = ((13, 120), (25, 558), (27, 82), (10, 194), (329, 101), (29, 741), (4, 6),
                    (205, 63))
#: The 9 that completed in its Mixtral run (the tokenizer differs: other input lengths).
_LAMBDA_MIXTRAL = ((14, 129), (30, 529), (28, 273), (12, 207), (375, 118), (29, 928),
                   (369, 26), (5, 9), (236, 49))


def _served(run: Run, *, server: bool = True) -> Run:
    """``run`` with the engine's default batch limits on its GPU (no flags given)."""
    from pagedkv.planner.gpus import resolve_gpu

    gpu = run.gpu if isinstance(run.gpu, GpuSpec) else resolve_gpu(run.gpu)
    budget, seqs = gpu.vllm_batch_defaults(server=server)
    return replace(run, token_budget=budget, max_running=seqs)


def _qwen235(n_in: int, n_out: int, n: int) -> Run:
    return Run(model="Qwen3-235B-A22B-Instruct-2507", gpu="H100-SXM", tp=4, fp8=True,
               input_tokens=n_in, output_tokens=n_out, concurrency=None, num_requests=n,
               token_budget=16384)


def _a100(c: int) -> Run:
    return _served(Run(model="Llama-3.1-8B", gpu="A100-40GB", input_tokens=1024,
                       output_tokens=128, concurrency=c, num_requests=20 * c))


def eos_lengths(input_tokens: int, max_output: int, mean_output: float,
                count: int) -> tuple[tuple[int, int], ...]:
    """``count`` (input, output) lengths of requests that stop at the model's end of
    sequence or at ``max_output`` (a benchmark without ``--ignore-eos``): each token ends
    the answer with one fixed probability, the one that makes the capped mean
    ``mean_output``; request ``i`` takes the quantile ``(i + 0.5) x 0.618... mod 1``
    (spread over the distribution, the same on every run)."""
    lo, hi = 1e-9, 1.0 - 1e-9
    for _ in range(100):  # the capped mean (1 - (1 - p)^max) / p falls as p grows
        p = (lo + hi) / 2
        lo, hi = (p, hi) if (1 - (1 - p) ** max_output) / p > mean_output else (lo, p)
    out = []
    for i in range(count):
        q = ((i + 0.5) * 0.6180339887498949) % 1.0
        n = math.ceil(math.log1p(-q) / math.log1p(-p))
        out.append((input_tokens, min(max_output, max(1, n))))
    return tuple(out)


#: [3]'s run: 300 random prompts, 256 in, at most 128 out; its table's output tokens/s over
#: requests/s gives 100.5 output tokens a request (210 / 2.09): answers end at EOS.
_RTX_LENGTHS = eos_lengths(256, 128, 100.5, 300)


def _rtx(c: int) -> Run:
    return _served(Run(model="Mistral-7B-v0.1", gpu=RTX_4090, input_tokens=256,
                       output_tokens=128, lengths=_RTX_LENGTHS, concurrency=c,
                       num_requests=300))


def _mlperf(gpu: str) -> Run:
    return _served(Run(model="Llama-3.1-8B", gpu=gpu, input_tokens=870, output_tokens=70,
                       concurrency=None, num_requests=2048, fp8=True), server=False)


POINTS: tuple[Point, ...] = (
    Point(name="Llama-3.1-8B A100-40GB c=1 TPOT", source=_MUSGRAVE, run=_a100(1),
          metric="tpot_ms", measured=13.3, tolerance=0.15),
    Point(name="Llama-3.1-8B A100-40GB c=8 / c=1 throughput", source=_MUSGRAVE,
          run=_a100(8), baseline=_a100(1), metric="ratio", measured=6.6, tolerance=1 - 5.5 / 6.6),
    Point(name="Llama-3.1-8B FP8 offline H100 / L40S throughput", source=_MLPERF,
          run=_mlperf("H100-SXM"), baseline=_mlperf("L40S"), metric="ratio",
          measured=5777 / 1642, tolerance=0.20),
    *(Point(name=f"Mistral-7B RTX 4090 c={c} output tokens/s", source=_RAHMAN, run=_rtx(c),
            metric="output_tok_s", measured=v, tolerance=0.20)
      for c, v in ((4, 210.0), (8, 377.0), (16, 644.0), (32, 975.0))),
    *(Point(name=f"Mistral-7B RTX 4090 c={c} mean TTFT", source=_RAHMAN, run=_rtx(c),
            metric="ttft_ms", measured=v, tolerance=0.20)
      for c, v in ((4, 63.0), (16, 155.0))),
    *(Point(name=f"Qwen3-8B H100 ShareGPT c=4 mean {what}",
            source=_GPUSTACK.format("qwen3-8b/h100-latency.md"),
            run=_served(Run(model="Qwen3-8B", gpu="H100-SXM", input_tokens=233,
                            output_tokens=221, concurrency=4, num_requests=100)),
            metric=metric, measured=v, tolerance=0.20)
      for what, metric, v in (("TPOT", "tpot_ms", 7.38), ("TTFT", "ttft_ms", 64.0))),
    Point(name="Llama-3.1-70B FP8 TP4 H100 median TPOT",
          source=_LAMBDA.format("4xH100-80GB-SXM/Meta-Llama-3.1-70B-Instruct-FP8_tp4_len2048"
                                ".json"),
          run=Run(model="Llama-3.1-70B", gpu="H100-SXM", tp=4, fp8=True, input_tokens=80,
                  output_tokens=279, lengths=_LAMBDA_70B, concurrency=None, num_requests=8),
          metric="tpot_ms", measured=13.12, tolerance=0.20),
    Point(name="Llama-3.1-70B FP8 TP2 A100-80GB median TPOT",
          source=_LAMBDA.format("2xA100-80GB-SXM/Meta-Llama-3.1-70B-Instruct-FP8_tp2_len2000"
                                ".json"),
          run=Run(model="Llama-3.1-70B", gpu="A100-80GB", tp=2, fp8=True, input_tokens=80,
                  output_tokens=252, lengths=_LAMBDA_70B_A100, concurrency=None,
                  num_requests=8),
          metric="tpot_ms", measured=29.39, tolerance=0.20),
    Point(name="Mixtral-8x7B TP4 H100 median TPOT",
          source=_LAMBDA.format("4xH100-80GB-SXM/Mixtral-8x7B-Instruct-v0.1_tp4_len2048.json"),
          run=Run(model="Mixtral-8x7B-Instruct-v0.1", gpu="H100-SXM", tp=4, input_tokens=122,
                  output_tokens=252, lengths=_LAMBDA_MIXTRAL, concurrency=None,
                  num_requests=9),
          metric="tpot_ms", measured=9.90, tolerance=0.20),
    *(Point(name=f"Qwen3-235B-A22B FP8 TP4 H100 {round(n_in / 1000)}K in x{n}: {what}",
            source=_GPUSTACK.format("qwen3-235b-a22b/h100.md"), run=_qwen235(n_in, n_out, n),
            metric=metric, measured=v, tolerance=0.20)
      for n_in, n_out, n, what, metric, v in (
          (3996, 182, 500, "output tok/s", "output_tok_s", 717.60),
          (3996, 182, 500, "mean TPOT", "tpot_ms", 89.52),
          (32000, 83, 100, "output tok/s", "output_tok_s", 39.66),
          (32000, 83, 100, "mean TPOT", "tpot_ms", 194.60))),
)


def closed_loop(run: Run, *, stagger_s: float = 0.0) -> Workload:
    """``run``'s requests as ``concurrency`` closed-loop streams (all at once offline),
    prompts unique (no prefix-cache hits: random-token benchmarks). Stream ``k`` starts
    at ``k * stagger_s``: a real benchmark's streams drift apart (tokenisation, network),
    a simulated one would otherwise stay in lockstep and prefill every stream together."""
    reqs: list[SimRequest] = []
    streams = run.concurrency or run.num_requests
    for i in range(run.num_requests):
        parent = i - streams if i >= streams and run.concurrency else None
        start = i * stagger_s if parent is None and run.concurrency else 0.0
        n_in, n_out = run.request_lengths(i)
        reqs.append(SimRequest(request_id=f"r{i}", arrival_s=start,
                               num_prompt_tokens=n_in, num_output_tokens=n_out,
                               parent=parent))
    return Workload(name="closed-loop", requests=tuple(reqs),
                    description=f"{run.num_requests} requests {run.input_tokens} in / "
                    f"{run.output_tokens} out, concurrency {run.concurrency or 'all'}")


def _model_file(run: Run, tmp: str) -> str:
    """``run.model``, or with ``fp8`` a config file of it with FP8 weights in ``tmp``."""
    if not run.fp8:
        return run.model
    from pagedkv import planner

    config, _, name = planner.load_config(run.model)
    path = Path(tmp) / f"{name}-FP8.json"
    path.write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}),
                    encoding="utf-8")
    return str(path)


def _max_running(run: Run) -> int:
    return run.max_running or (1024 if run.concurrency is None else 256)


def simulate_run(run: Run, constants: ClockConstants | None = None) -> dict[str, float]:
    """Replay ``run`` on the roofline clock; mean TTFT and TPOT (ms), output tokens/s."""
    from pagedkv.planner.gpus import resolve_gpu
    from pagedkv.sim.api import SimConfig
    from pagedkv.sim.api import run as simulate
    from pagedkv.sim.clock import typical_context
    from pagedkv.sim.clock.roofline import RooflineStepModel
    from pagedkv.sim.clock.shape import model_shape
    from pagedkv.sim.scheduler import SchedulerConfig

    wl = closed_loop(run)
    with tempfile.TemporaryDirectory() as tmp:
        model = _model_file(run, tmp)
        g = run.gpu if isinstance(run.gpu, GpuSpec) else resolve_gpu(run.gpu)
        clock = RooflineStepModel.build(model_shape(model, tp=run.tp), g,
                                        constants or CONSTANT_SETS["default"],
                                        typical_context_tokens=typical_context(wl))
        # `vllm bench serve --max-concurrency C` starts its first C requests together;
        # answers of different lengths then spread the streams. Identical ones would keep
        # them in lockstep, which a real run's noise does not: those streams start spread
        # evenly over one request's life instead
        if run.concurrency and not run.lengths:
            life_s = run.output_tokens * clock.step_time_s(0, run.concurrency)
            wl = closed_loop(run, stagger_s=life_s / run.concurrency)
        cfg = SimConfig(model=model, gpu_memory=g.memory, tp=run.tp, bounds=False, jobs=1,
                        scheduler=SchedulerConfig(max_running=_max_running(run),
                                                  token_budget=run.token_budget,
                                                  step_time=clock))
        rep = simulate(wl, cfg)
    assert rep.engine is not None and rep.result is not None
    res = rep.result
    ttft = [f - a for a, f in zip(res.arrival_s, res.first_token_s, strict=True)
            if f is not None]
    outs = res.output_tokens or [run.output_tokens] * len(res.first_token_s)
    tpot = [(e - f) / (o - 1) for f, e, o in
            zip(res.first_token_s, res.finish_s, outs, strict=True)
            if f is not None and e is not None and o > 1]
    return {"ttft_ms": 1e3 * sum(ttft) / len(ttft), "tpot_ms": 1e3 * sum(tpot) / len(tpot),
            "output_tok_s": rep.engine.output_tokens_per_s or 0.0}


def simulate_point(point: Point, constants: ClockConstants | None = None) -> float:
    """The simulated counterpart of ``point.measured``."""
    got = simulate_run(point.run, constants)
    if point.baseline is None:
        return got[point.metric]
    base = simulate_run(point.baseline, constants)
    return got["output_tok_s"] / base["output_tok_s"]


def setup_key(run: Run) -> tuple[str, str, int, bool]:
    """(model, GPU, TP, FP8 weights): the deployment a run measured, a calibration's key."""
    gpu = run.gpu.name if isinstance(run.gpu, GpuSpec) else run.gpu
    return run.model, gpu, run.tp, run.fp8


def calibrated_constants(points: tuple[Point, ...] = POINTS) -> dict[
        tuple[str, str, int, bool], ClockConstants]:
    """``--calibrate`` on the published points themselves: per setup (model, GPU, TP,
    weights), the constants fitted to its TTFT and TPOT points, each replayed as its run
    (a setup without such a point keeps the defaults). The table's "calibrated" column."""
    from pagedkv.planner.gpus import resolve_gpu
    from pagedkv.sim.clock.calibrate import fit_constants
    from pagedkv.sim.clock.measured import Measured
    from pagedkv.sim.clock.replay import ReplaySetup

    out: dict[tuple[str, str, int, bool], ClockConstants] = {}
    groups: dict[tuple[str, str, int, bool], list[Point]] = {}
    for p in points:
        groups.setdefault(setup_key(p.run), []).append(p)
    with tempfile.TemporaryDirectory() as tmp:
        for key, pts in groups.items():
            data = []
            for p in pts:
                if p.metric not in ("ttft_ms", "tpot_ms") or p.baseline is not None:
                    continue
                r = p.run
                n = len(r.lengths) or 1
                data.append(Measured(
                    input_tokens=sum(r.request_lengths(i)[0] for i in range(n)) // n,
                    output_tokens=sum(r.request_lengths(i)[1] for i in range(n)) // n,
                    concurrency=r.concurrency or r.num_requests, count=r.num_requests,
                    ttft_s=p.measured / 1e3 if p.metric == "ttft_ms" else 0.0,
                    tpot_s=p.measured / 1e3 if p.metric == "tpot_ms" else None))
            if not data:
                continue
            run = pts[0].run
            g = run.gpu if isinstance(run.gpu, GpuSpec) else resolve_gpu(run.gpu)
            setup = ReplaySetup(model=_model_file(run, tmp), gpu=g, tp=run.tp,
                                token_budget=run.token_budget, max_running=_max_running(run))
            out[key] = fit_constants(data, setup, name="calibrated").constants
    return out


def _table() -> None:  # pragma: no cover - the docs' table
    fitted = calibrated_constants()
    print("| point | measured | simulated | error | calibrated | error |")
    print("|---|---:|---:|---:|---:|---:|")
    errors, after = [], []
    for p in POINTS:
        sim = simulate_point(p)
        err = (sim - p.measured) / p.measured
        errors.append(abs(err))
        cal = fitted.get(setup_key(p.run))
        sim2 = simulate_point(p, cal) if cal is not None else sim
        err2 = (sim2 - p.measured) / p.measured
        after.append(abs(err2))
        print(f"| {p.name} | {p.measured:.4g} | {sim:.4g} | {100 * err:+.1f} % | "
              f"{sim2:.4g} | {100 * err2:+.1f} % |")
    print(f"\nmean absolute error {100 * sum(errors) / len(errors):.1f} % over {len(errors)} "
          f"points with the default constants, {100 * sum(after) / len(after):.1f} % with "
          "each setup's constants fitted by --calibrate to its TTFT and TPOT points")


if __name__ == "__main__":  # pragma: no cover
    _table()
