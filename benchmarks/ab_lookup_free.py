#!/usr/bin/env python3
"""A new request's three calls on the compiled core — ``get_computed_blocks``, the first
``allocate_slots`` and ``free`` — through the compiled entries (``DecodeAllocate``'s,
``_csrc/ccore_lookup.h`` and ``ccore_admit.h``) against the Python methods they stand in
front of (``facade_lookups.get_computed_blocks``, ``facade_allocation.allocate_slots``,
``facade_frees.free``), in one process.

Each round replays the same unshared prompts (the harness's new-request-heavy shape:
256-2,048 tokens, block 16, 10,000 blocks, so once the pool is full every take evicts a
cached block) on a fresh manager once per side, the side going first alternating: look
the prompt up, allocate it whole, keep 32 running (the oldest freed). Each call type is
timed alone. Prints, per call type, the median over rounds of µs per call on both sides.

::

    python benchmarks/ab_lookup_free.py
    python benchmarks/ab_lookup_free.py --prompts 600 --rounds 9
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from pagedkv import FullAttentionSpec, KVCacheManager, Request
from pagedkv.core import facade_allocation, facade_frees, facade_lookups, native

SPEC = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
CALLS = ("lookup", "first allocate", "free")


def python_entries(mgr: KVCacheManager) -> tuple[Any, Any, Any]:
    """The Python methods, bound to ``mgr`` by hand."""
    return (lambda r: facade_lookups.get_computed_blocks(mgr, r),
            lambda r, n, hit: facade_allocation.allocate_slots(mgr, r, n,
                                                               new_computed_blocks=hit),
            lambda r: facade_frees.free(mgr, r))


def replay_us(prompts: list[list[int]], compiled: bool, running: int) -> dict[str, float]:
    """µs per call of each type over ``prompts`` on a fresh manager."""
    mgr = KVCacheManager.from_spec(SPEC, num_blocks=10_000, max_model_len=4096)
    if compiled:
        lookup, allocate, free = (mgr.get_computed_blocks,
                                  lambda r, n, hit: mgr.allocate_slots(
                                      r, n, new_computed_blocks=hit), mgr.free)
    else:
        lookup, allocate, free = python_entries(mgr)
    spent = dict.fromkeys(CALLS, 0.0)
    live: list[Request] = []
    clock = time.perf_counter
    for i, prompt in enumerate(prompts):
        req = Request(f"r{i}", prompt, hasher=mgr.hasher)
        t0 = clock()
        hit = lookup(req)
        t1 = clock()
        out = allocate(req, req.num_tokens - hit.num_computed_tokens, hit)
        t2 = clock()
        spent["lookup"] += t1 - t0
        spent["first allocate"] += t2 - t1
        if out is None:
            raise SystemExit("the pool is too small for this workload")
        req.num_computed_tokens = req.num_tokens
        live.append(req)
        if len(live) > running:
            old = live.pop(0)
            t0 = clock()
            free(old)
            spent["free"] += clock() - t0
    frees = max(1, len(prompts) - running)
    return {"lookup": spent["lookup"] / len(prompts) * 1e6,
            "first allocate": spent["first allocate"] / len(prompts) * 1e6,
            "free": spent["free"] / frees * 1e6}


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
    times: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for r in range(a.rounds):
        for compiled in ((True, False) if r % 2 else (False, True)):
            times[compiled].append(replay_us(prompts, compiled, a.running))
    print(f"{a.prompts} unshared 256-2,048-token prompts, block 16, 10,000 blocks, "
          f"median of {a.rounds} alternating rounds, us per call:")
    print(f"  {'call':<16}{'Python method':>14}{'compiled':>10}{'less':>7}")
    for call in CALLS:
        py = statistics.median(t[call] for t in times[False])
        c = statistics.median(t[call] for t in times[True])
        print(f"  {call:<16}{py:>14.2f}{c:>10.2f}{(1 - c / py) * 100:>6.0f}%")


if __name__ == "__main__":
    main()
