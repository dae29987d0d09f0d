#!/usr/bin/env python3
"""A request's first ``allocate_slots`` on the compiled core: the compiled admission
(``DecodeAllocate`` taking the first call, ``_csrc/ccore_admit.h``) against the Python
method it stands in front of (``facade_allocation.allocate_slots``), in one process.

Each round replays the same unshared prompts on a fresh manager once per side (the side
that goes first alternates): look the prompt up, allocate it whole with its hit, keep 32
running (the oldest freed, so later prompts evict cached blocks). Times only the
allocation call. Prints the median over rounds of µs per call for both sides.

::

    python benchmarks/ab_admission.py
    python benchmarks/ab_admission.py --prompts 600 --rounds 9
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from pagedkv import FullAttentionSpec, KVCacheManager, Request
from pagedkv.core import facade_allocation, native

SPEC = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)


def replay_us(prompts: list[list[int]], compiled: bool, running: int) -> float:
    """µs per first ``allocate_slots`` over ``prompts`` on a fresh manager; ``compiled``:
    the manager's own (compiled) entry, else the Python method."""
    mgr = KVCacheManager.from_spec(SPEC, num_blocks=10_000, max_model_len=4096)
    python_method = facade_allocation.allocate_slots
    total_s = 0.0
    live: list[Request] = []
    for i, prompt in enumerate(prompts):
        req = Request(f"r{i}", prompt, hasher=mgr.hasher)
        hit = mgr.get_computed_blocks(req)
        n = req.num_tokens - hit.num_computed_tokens
        t = time.perf_counter()
        if compiled:
            out = mgr.allocate_slots(req, n, new_computed_blocks=hit)
        else:
            out = python_method(mgr, req, n, new_computed_blocks=hit)
        total_s += time.perf_counter() - t
        if out is None:
            raise SystemExit("the pool is too small for this workload")
        req.num_computed_tokens = req.num_tokens
        live.append(req)
        if len(live) > running:
            mgr.free(live.pop(0))
    return total_s / len(prompts) * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--running", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if native.active() is None:
        raise SystemExit(f"the compiled core is not in use ({native.IMPORT_ERROR})")
    rng = random.Random(a.seed)
    prompts = [[rng.randrange(32000) for _ in range(rng.randrange(256, 2049))]
               for _ in range(a.prompts)]
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(a.rounds):
        for compiled in ((True, False) if r % 2 else (False, True)):
            times[compiled].append(replay_us(prompts, compiled, a.running))
    py, c = statistics.median(times[False]), statistics.median(times[True])
    print(f"first allocate_slots, {a.prompts} unshared 256-2,048-token prompts, block 16, "
          f"median of {a.rounds} alternating rounds:")
    print(f"  Python method {py:.1f} us, compiled admission {c:.1f} us per call "
          f"({(1 - c / py) * 100:.0f} % less)")


if __name__ == "__main__":
    main()
