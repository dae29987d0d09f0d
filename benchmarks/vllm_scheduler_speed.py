"""vLLM 0.33's own scheduler, stock vs pagedkv as its KV-cache manager: time per engine
step of ``schedule()`` + ``update_from_output()`` with no model (one sampled token per
request per step; the model output is built outside the clock), at a given number of
running requests, sync and async scheduling, full attention and a hybrid (full attention
+ a sliding-window group).

Run under an interpreter with vLLM 0.33.0 (CPU build) and pagedkv importable::

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=src $V benchmarks/vllm_scheduler_speed.py \\
        --running 64 256 1024 --rounds 5

Each cell: ``--running`` requests admitted at once (``max_num_seqs`` = that count, a pool
that holds them all: no preemption), each a shared prefix plus a random tail, decoding
``--decode-tokens`` tokens. With async scheduling the next step is scheduled before the
previous step's output is processed (one step in flight, as vLLM's engine core runs an
async scheduler). Sides alternate round by round (the first side rotates); each round
builds fresh schedulers and replays the same requests, so both sides see the same load;
the collector's heap is frozen after each build (as vLLM's engine core freezes it after
start-up); the clock is the process's CPU time by default (``--clock wall`` for elapsed time), so
that time the machine's other processes take is not counted.
Printed per cell: each side's median microseconds per step over the rounds with the
rounds' range, the median of the per-round ratios (stock time / pagedkv time: > 1 means
pagedkv's steps are faster) with their range, and whether both sides scheduled the same
tokens and block ids (a digest per round). ``--profile`` runs one more pagedkv round of
the first cell under cProfile and prints the top entries by own time, and the share of
the step spent in pagedkv's code vs vLLM's. The exit code is 1 when any schedules differ.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from pagedkv.vllm import harness  # noqa: E402

CONFIG_JSON = REPO / "conformance" / "data" / "opt-125m-config.json"
BLOCK_SIZE = harness.BLOCK_SIZE


def build(model: str, cls: Any, running: int, window: int | None, async_: bool,
          args: argparse.Namespace) -> Any:
    """A scheduler with ``running`` requests added (none scheduled yet)."""
    tokens = args.shared_tokens + args.tail_tokens[1] + args.decode_tokens
    num_blocks = running * (-(-tokens // BLOCK_SIZE) + 2) * (2 if window else 1) + 64
    s = harness.build_scheduler(
        model, cls, async_scheduling=async_, num_blocks=num_blocks, window=window,
        max_num_seqs=running, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=tokens + 16, log_stats=True)
    for r in harness.make_requests(running, shared=args.shared_tokens,
                                   num_prefixes=args.num_prefixes, seed=args.seed,
                                   max_tokens=args.decode_tokens,
                                   tail_tokens=tuple(args.tail_tokens)):
        s.add_request(r)
    return s


def model_output(scheduler: Any, out: Any, step_index: int) -> Any:
    """The output the step's model would give: one token per request whose scheduled
    tokens reach the end of its tokens (as :func:`pagedkv.vllm.harness.schedule`)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    reqs = scheduler.requests
    sampled = [[] if reqs[r].num_computed_tokens < reqs[r].num_tokens else [1000 + step_index]
               for r in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


class Run:
    """One scheduler driven step by step: :meth:`step` runs one engine step (timed:
    ``schedule()`` + ``update_from_output()``; the model-output stand-in is built outside
    the clock) and says whether the scheduler has more to do."""

    def __init__(self, s: Any, async_: bool, clock: Any = time.process_time,
                 profiler: cProfile.Profile | None = None) -> None:
        self.s, self.async_, self.clock, self.profiler = s, async_, clock, profiler
        self.digest = hashlib.sha256()
        self.elapsed = 0.0
        self.steps = 0
        self.pending: Any = None  # async: one step in flight, as vLLM's engine core runs it

    @property
    def done(self) -> bool:
        return not self.s.has_requests() and self.pending is None

    def step(self) -> None:
        s, clock, prof = self.s, self.clock, self.profiler
        if prof is not None:
            prof.enable()
        t0 = clock()
        out = s.schedule() if s.has_requests() else None
        self.elapsed += clock() - t0
        if prof is not None:
            prof.disable()
        now = None if out is None else (out, model_output(s, out, self.steps))
        pending = self.pending
        if not self.async_:
            pending, now = now, None
        if prof is not None:
            prof.enable()
        t0 = clock()
        if pending is not None:
            s.update_from_output(*pending)
        self.elapsed += clock() - t0
        if prof is not None:
            prof.disable()
        self.pending = now
        self.steps += 1
        if out is not None:
            d = self.digest
            d.update(repr(sorted(out.num_scheduled_tokens.items())).encode())
            d.update(repr([(r.req_id, r.block_ids) for r in out.scheduled_new_reqs]).encode())
            d.update(repr(out.scheduled_cached_reqs.new_block_ids).encode())


def one_round(s: Any, async_: bool, clock: Any = time.process_time
              ) -> tuple[float, int, str]:
    """Seconds in schedule() + update_from_output() by ``clock``, steps, digest of the
    schedule."""
    run = Run(s, async_, clock)
    while not run.done:
        run.step()
    return run.elapsed, run.steps, run.digest.hexdigest()[:16]


def lockstep(runs: list[Run]) -> None:
    """Drive ``runs`` one step each in turn until all are done, the first to step
    alternating from step to step, so that every side's steps see the machine as it is
    at that moment (a shared machine's load moves within a round)."""
    i = 0
    while not all(r.done for r in runs):
        for r in (runs if i % 2 == 0 else runs[::-1]):
            if not r.done:
                r.step()
        i += 1


def classes(async_: bool) -> dict[str, Any]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler

    return {"stock": AsyncScheduler if async_ else Scheduler,
            "pagedkv": PagedKVAsyncScheduler if async_ else PagedKVScheduler}


def cell(model: str, running: int, window: int | None, async_: bool,
         args: argparse.Namespace) -> dict[str, Any]:
    """Alternating rounds of one cell: per-side times, per-round ratios, digests."""
    sides = classes(async_)
    times: dict[str, list[float]] = {k: [] for k in sides}
    ratios: list[float] = []
    digests: dict[str, set[str]] = {k: set() for k in sides}
    steps = 0
    for rnd in range(args.rounds):
        got: dict[str, float] = {}
        order = list(sides) if rnd % 2 == 0 else list(reversed(sides))
        if args.mode == "lockstep":
            built = {side: build(model, sides[side], running, window, async_, args)
                     for side in order}
            gc.collect()
            gc.freeze()  # as vLLM's engine core does once it has started
            runs = {side: Run(built[side], async_, CLOCKS[args.clock]) for side in order}
            lockstep([runs[side] for side in order])
            gc.unfreeze()
            del built
            results = {side: (r.elapsed, r.steps, r.digest.hexdigest()[:16])
                       for side, r in runs.items()}
        else:
            results = {}
            for side in order:
                s = build(model, sides[side], running, window, async_, args)
                gc.collect()
                gc.freeze()
                results[side] = one_round(s, async_, CLOCKS[args.clock])
                gc.unfreeze()
                del s
        for side, (elapsed, steps, digest) in results.items():
            got[side] = elapsed / steps * 1e6
            times[side].append(got[side])
            digests[side].add(digest)
        ratios.append(got["stock"] / got["pagedkv"])
    same = digests["stock"] == digests["pagedkv"] and len(digests["stock"]) == 1
    return {"times": times, "ratios": ratios, "same": same, "steps": steps}


KV_FILES = ("vllm/v1/core/kv_cache_manager.py", "vllm/v1/core/block_pool.py",
            "vllm/v1/core/single_type_kv_cache_manager.py",
            "vllm/v1/core/kv_cache_coordinator.py")


def in_kv(func: tuple[str, int, str]) -> bool:
    """Whether a profiled function is KV-cache manager code: vLLM's manager, coordinator,
    per-type managers and block pool (stock), or any of pagedkv's modules, its compiled
    core's methods included."""
    path, _line, name = func
    return path.endswith(KV_FILES) or "/pagedkv/" in path or "pagedkv.core._ccore" in name


def kv_share(raw: dict[Any, Any]) -> float:
    """Seconds spent inside KV-cache manager code, callees included: the cumulative time
    of every call into it from code outside it."""
    inside = 0.0
    for func, (_cc, _nc, _tt, _ct, callers) in raw.items():
        if in_kv(func):
            inside += sum(c[3] for caller, c in callers.items() if not in_kv(caller))
    return inside


def profile(model: str, running: int, window: int | None, async_: bool,
            args: argparse.Namespace) -> None:
    """One round, both sides in lockstep, each side's steps (``schedule()`` +
    ``update_from_output()``) under its own cProfile: the share of the step inside the
    KV-cache manager (callees included) per side, and pagedkv's top entries by own time."""
    layout = f"full + window {window}" if window else "full attention"
    print(f"\nprofile: {running} running, {'async' if async_ else 'sync'}, {layout} "
          "(cProfile, one round, sides in lockstep; times inflated by the profiler)")
    sides = classes(async_)
    built = {side: build(model, cls, running, window, async_, args)
             for side, cls in sides.items()}
    profs = {side: cProfile.Profile() for side in sides}
    runs = [Run(built[side], async_, profiler=profs[side]) for side in sides]
    lockstep(runs)
    totals: dict[str, tuple[float, float]] = {}
    for side in sides:
        stats = pstats.Stats(profs[side])
        raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
        total = stats.total_tt  # type: ignore[attr-defined]
        kv = kv_share(raw)
        totals[side] = (total, kv)
        print(f"  {side}: {total:.2f} s profiled, KV-cache manager {kv:.2f} s "
              f"({100 * kv / total:.0f} %), the rest (vLLM's scheduler and requests) "
              f"{total - kv:.2f} s")
        if side != "pagedkv":
            continue
        ceiling = totals["stock"][0] / (total - kv)
        print(f"  ceiling: stock / (pagedkv without its manager's time) = {ceiling:.2f} "
              f"(profiled ratio {totals['stock'][0] / total:.2f}): the step ratio a "
              "manager taking no time at all would give")
        top = sorted(raw.items(), key=lambda kv: -kv[1][2])[:args.profile_top]
        print("| own % | calls | function |\n| ---: | ---: | --- |")
        for (path, line, name), v in top:
            short = path.split("site-packages/")[-1].split("/src/")[-1]
            print(f"| {100 * v[2] / total:.1f} | {v[1]} | {short}:{line} {name} |")


def fmt(values: list[float], digits: int = 0) -> str:
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--running", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--scheduling", nargs="+", choices=["sync", "async"],
                   default=["sync", "async"])
    p.add_argument("--layouts", nargs="+", choices=["full", "hybrid"],
                   default=["full", "hybrid"])
    p.add_argument("--window", type=int, default=128, help="the hybrid's sliding window")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--shared-tokens", type=int, default=128)
    p.add_argument("--tail-tokens", type=int, nargs=2, default=[16, 64])
    p.add_argument("--decode-tokens", type=int, default=48)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                   help="cpu: this process's CPU time (time other processes take from a "
                        "shared machine's cores left out); wall: elapsed time")
    p.add_argument("--mode", choices=["lockstep", "rounds"], default="lockstep",
                   help="lockstep: both sides built, then driven one step each in turn "
                        "(the first alternating); rounds: one side's whole round, then the "
                        "other's")
    p.add_argument("--profile", action="store_true", help="profile the first cell's pagedkv")
    p.add_argument("--profile-top", type=int, default=15)
    args = p.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f} (1/5/15 min)")
    print(f"workload: per cell N requests running at once, {args.num_prefixes} shared "
          f"prefixes of {args.shared_tokens} tokens, tails of {args.tail_tokens[0]}-"
          f"{args.tail_tokens[1] - 1} tokens, {args.decode_tokens} decode tokens each; "
          f"{args.rounds} rounds ({args.mode}); hybrid: window {args.window}; block "
          f"{BLOCK_SIZE}; clock: {args.clock}")
    print("| running | scheduling | layout | steps | stock us/step | pagedkv us/step | "
          "stock/pagedkv | schedules |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | --- |")
    all_same = True
    with tempfile.TemporaryDirectory() as tmp:
        model = harness.model_dir(CONFIG_JSON, Path(tmp))
        for running in args.running:
            for mode in args.scheduling:
                for layout in args.layouts:
                    window = args.window if layout == "hybrid" else None
                    r = cell(model, running, window, mode == "async", args)
                    all_same &= r["same"]
                    print(f"| {running} | {mode} | {layout} | {r['steps']} | "
                          f"{fmt(r['times']['stock'])} | {fmt(r['times']['pagedkv'])} | "
                          f"{fmt(r['ratios'], 2)} | {'equal' if r['same'] else 'DIFFERENT'} |",
                          flush=True)
        if args.profile:
            layout = args.layouts[0]
            profile(model, args.running[0], args.window if layout == "hybrid" else None,
                    args.scheduling[0] == "async", args)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f} (1/5/15 min); cells: median (range) over rounds")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
