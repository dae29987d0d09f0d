"""vLLM 0.33's own scheduler, stock vs pagedkv as its KV-cache manager: time per engine
step of ``schedule()`` + ``update_from_output()`` with no model (one sampled token per
request per step), synthetic requests with shared prefixes, long decodes and a pool
small enough to evict and preempt.

Run under an interpreter with vLLM 0.33.0 (CPU build) and pagedkv importable::

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=src $V benchmarks/vllm_scheduler_speed.py --rounds 3

With ``--async-scheduling`` the next step is scheduled before the previous step's output
is processed (one step in flight, as vLLM's engine core runs an async scheduler).
Sides alternate round by round (the first side rotates); each round builds fresh
schedulers and replays the same requests. Printed: per side the median of the rounds'
microseconds per step, and the median of the per-round ratios (stock time / pagedkv
time: > 1 means pagedkv's scheduler steps are faster), plus a digest of each side's
scheduled tokens and block ids (equal digests: the same schedule).
"""

from __future__ import annotations

import argparse
import hashlib
import os
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


def one_round(model: str, cls: Any, args: argparse.Namespace) -> tuple[float, int, str]:
    """Seconds in schedule()+update_from_output(), steps, digest of the schedule."""
    s = harness.build_scheduler(
        model, cls, async_scheduling=args.async_scheduling, num_blocks=args.num_blocks,
        window=args.window, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, log_stats=True)
    for r in harness.make_requests(args.num_requests, shared=args.shared_tokens,
                                   num_prefixes=args.num_prefixes, seed=args.seed,
                                   max_tokens=args.decode_tokens, tail_tokens=(16, 256)):
        s.add_request(r)
    digest = hashlib.sha256()
    elapsed = 0.0
    steps = 0
    clock = time.perf_counter
    pending = None  # async: one step in flight, as vLLM's engine core runs it
    while s.has_requests() or pending is not None:
        t0 = clock()
        now = harness.schedule(s, steps) if s.has_requests() else None
        scheduled = now
        if not args.async_scheduling:
            pending, now = now, None
        if pending is not None:
            s.update_from_output(*pending)
        pending = now
        elapsed += clock() - t0
        steps += 1
        if scheduled is not None:
            out = scheduled[0]
            digest.update(repr(sorted(out.num_scheduled_tokens.items())).encode())
            digest.update(repr([(r.req_id, r.block_ids)
                                for r in out.scheduled_new_reqs]).encode())
            digest.update(repr(out.scheduled_cached_reqs.new_block_ids).encode())
    return elapsed, steps, digest.hexdigest()[:16]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--shared-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--num-blocks", type=int, default=800)
    p.add_argument("--window", type=int, default=None, help="add a sliding-window group")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--async-scheduling", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler

    sides = {"stock": AsyncScheduler if args.async_scheduling else Scheduler,
             "pagedkv": PagedKVAsyncScheduler if args.async_scheduling else PagedKVScheduler}
    times: dict[str, list[float]] = {k: [] for k in sides}
    ratios: list[float] = []
    digests: dict[str, set[str]] = {k: set() for k in sides}
    steps_seen = 0
    with tempfile.TemporaryDirectory() as tmp:
        model = harness.model_dir(CONFIG_JSON, Path(tmp))
        for rnd in range(args.rounds):
            order = list(sides) if rnd % 2 == 0 else list(reversed(sides))
            got: dict[str, float] = {}
            for side in order:
                elapsed, steps, digest = one_round(model, sides[side], args)
                got[side] = elapsed / steps * 1e6
                times[side].append(got[side])
                digests[side].add(digest)
                steps_seen = steps
            ratios.append(got["stock"] / got["pagedkv"])
            print(f"round {rnd + 1}: stock {got['stock']:.0f} us/step, pagedkv "
                  f"{got['pagedkv']:.0f} us/step, ratio {ratios[-1]:.2f}", file=sys.stderr)
    same = digests["stock"] == digests["pagedkv"] and len(digests["stock"]) == 1
    print(f"workload: {args.num_requests} requests, {args.num_prefixes} prefixes of "
          f"{args.shared_tokens} tokens, {args.decode_tokens} decode tokens, "
          f"{args.num_blocks} blocks, window {args.window}, "
          f"{'async' if args.async_scheduling else 'sync'}; {steps_seen} steps")
    print("| side | us per step (median of rounds) |\n| --- | ---: |")
    for side in sides:
        print(f"| {side} | {statistics.median(times[side]):.0f} |")
    print(f"ratio stock/pagedkv (median of {args.rounds} same-round ratios): "
          f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")
    print(f"schedules: {'equal' if same else 'DIFFERENT'} "
          f"(stock {sorted(digests['stock'])}, pagedkv {sorted(digests['pagedkv'])})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
