#!/usr/bin/env python3
"""Decode allocation cost: ``allocate_slots(request, 1)`` for running requests, the call an
engine makes once per request per step. Prints ns per call (best of rounds: other load only
slows a round down) on the core in use (``PAGEDKV_PURE=1`` for the pure one).

    python benchmarks/decode_allocate.py [--rounds 7] [--requests 64] [--steps 256]
"""

from __future__ import annotations

import argparse
import time

from pagedkv import FullAttentionSpec, KVCacheManager, Request
from pagedkv.core import native


def one_round(num_requests: int, steps: int) -> float:
    """ns per decode allocate_slots call over ``steps`` steps of ``num_requests``."""
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
    mgr = KVCacheManager.from_spec(spec, num_blocks=num_requests * 40, max_model_len=8192)
    reqs = []
    for i in range(num_requests):
        req = Request(f"r{i}", [i * 7919 + j for j in range(100)], hasher=mgr.hasher)
        mgr.allocate_slots(req, 100)
        req.num_computed_tokens = 100
        reqs.append(req)
    alloc = mgr.allocate_slots
    spent = 0.0
    for step in range(steps):
        for req in reqs:
            req.append_output_tokens(step)
        t = time.perf_counter()
        for req in reqs:
            alloc(req, 1)
        spent += time.perf_counter() - t
        for req in reqs:
            req.num_computed_tokens += 1
    return spent / (steps * num_requests) * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--steps", type=int, default=256)
    a = ap.parse_args()
    best = min(one_round(a.requests, a.steps) for _ in range(a.rounds))
    print(f"decode allocate_slots ({native.CORE} core): {best:.0f} ns per call "
          f"(best of {a.rounds} rounds, {a.requests} requests x {a.steps} steps)")


if __name__ == "__main__":
    main()
