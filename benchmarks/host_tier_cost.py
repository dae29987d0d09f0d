#!/usr/bin/env python3
"""What the host tier costs and brings per request: the plain manager against the
host-tiered one on the same request stream (shared-prefix families, a device pool too
small to keep them, every plan confirmed at once). Rounds alternate which side goes
first; prints the median of the per-round speed ratios and each side's hit tokens.

    python benchmarks/host_tier_cost.py [--requests 3000] [--num-blocks 400]
        [--host-blocks 8000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
from pagedkv.host import HostTierConfig, HostTieredKVCacheManager

BS = 16


def stream(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    families = [[f * 100_000 + i for i in range(2048)] for f in range(64)]
    out = []
    for i in range(n):
        fam = families[rng.randrange(len(families))]
        shared = rng.randrange(64, 1536)
        out.append(fam[:shared] + [10**9 + i * 1000 + j for j in range(rng.randrange(16, 256))])
    return out


def run(mgr: Any, prompts: list[list[int]], tiered: bool) -> tuple[float, int, int]:
    hit_device = hit_host = 0
    t0 = time.perf_counter()
    for i, tokens in enumerate(prompts):
        req = mgr.new_request(f"r{i}", tokens)
        if tiered:
            hit = mgr.host.lookup(req)
            hit_device += hit.num_device_tokens
            hit_host += hit.num_host_tokens
        else:
            hit = mgr.get_computed_blocks(req)
            hit_device += hit.num_computed_tokens
        new = mgr.allocate_slots(req, len(tokens) - hit.num_computed_tokens,
                                 new_computed_blocks=hit)
        assert new is not None
        if tiered:
            for s in mgr.host.take_store_plans():
                mgr.host.complete_store(s, True)
            req.num_computed_tokens = len(tokens)
            for p in mgr.host.take_load_plans():
                mgr.host.complete_load(p, True)
        mgr.free(req)
    return time.perf_counter() - t0, hit_device, hit_host


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--num-blocks", type=int, default=400)
    ap.add_argument("--host-blocks", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=8, head_size=128, dtype_bytes=2)
    cfg = CacheConfig(groups=(spec,), num_blocks=args.num_blocks, max_model_len=4096)
    prompts = stream(args.requests, 0)
    ratios = []
    hits: dict[str, tuple[int, int]] = {}
    for r in range(args.rounds):
        times = {}
        order = ["plain", "host"] if r % 2 == 0 else ["host", "plain"]
        for side in order:
            if side == "plain":
                t, d, h = run(KVCacheManager(cfg), prompts, False)
            else:
                m = HostTieredKVCacheManager(cfg, HostTierConfig(num_blocks=args.host_blocks))
                t, d, h = run(m, prompts, True)
            times[side] = t
            hits[side] = (d, h)
        ratios.append(times["plain"] / times["host"])
        print(f"round {r}: plain {args.requests / times['plain']:,.0f} req/s, "
              f"host tier {args.requests / times['host']:,.0f} req/s")
    total = sum(len(p) for p in prompts)
    for side, (d, h) in hits.items():
        print(f"{side:6s} hit tokens: device {d / total:.1%}, host {h / total:.1%} "
              f"of {total:,} prompt tokens")
    print(f"speed host tier / plain (median of {args.rounds} same-round ratios): "
          f"{statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
