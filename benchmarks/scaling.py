#!/usr/bin/env python3
"""Per-operation cost must not grow with pool size: the same operations on pools of
10,000 and 1,000,000 blocks, each pool first filled to capacity with cached blocks (so the
prefix index and the free queue are as large as the pool), then measured.

Prints, per pool size: build time, bytes per block (tracemalloc, manager just built), and
the best-of-N cost of: allocate a 64-block prompt (evicting cached blocks), free it, and a
64-block lookup that hits; then the 1M/10k ratios. Last, the same ratio for a bare Python
dict of that many 32-byte keys (64 deletes of old keys, 64 inserts of new ones): the memory
latency any dict-backed prefix index pays once its table outgrows the CPU caches, whatever
the code around it costs.

    python benchmarks/scaling.py
    python benchmarks/scaling.py --json      # one JSON line {"10000": {...}, "1000000": {...}}
    PAGEDKV_PURE=1 python benchmarks/scaling.py    # the pure-Python core
"""

from __future__ import annotations

import gc
import json
import random
import sys
import time
import tracemalloc

from pagedkv import FullAttentionSpec, KVCacheManager

BS = 16
SPEC = FullAttentionSpec(block_size=BS, num_kv_heads=8, head_size=128, dtype_bytes=2)


def fill_with_cached_blocks(mgr: KVCacheManager, *, spare_blocks: int) -> None:
    """Fill the pool with cached blocks (1,024-token requests allocated then freed) until
    all but ``spare_blocks`` usable blocks are cached."""
    target = mgr.pool.num_blocks - 1 - spare_blocks
    n = 0
    while mgr.pool.num_cached_blocks() < target:
        req = mgr.new_request(f"fill{n}", [n * 1024 + i for i in range(1024)])
        if mgr.allocate_slots(req, 1024) is None:
            break
        mgr.free(req)
        n += 1


def measure(num_blocks: int, rounds: int = 200) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    mgr = KVCacheManager.from_spec(SPEC, num_blocks=num_blocks, max_model_len=1 << 20)
    bytes_per_block = tracemalloc.get_traced_memory()[0] / num_blocks
    tracemalloc.stop()
    del mgr
    gc.collect()
    build_s = float("inf")
    for _ in range(3):  # tracemalloc slows allocation: time the build without it
        t = time.perf_counter()
        mgr = KVCacheManager.from_spec(SPEC, num_blocks=num_blocks, max_model_len=1 << 20)
        build_s = min(build_s, time.perf_counter() - t)

    fill_with_cached_blocks(mgr, spare_blocks=64)
    rng = random.Random(0)
    hot = mgr.new_request("hot", [rng.randrange(32000) for _ in range(64 * BS + 1)])
    mgr.allocate_slots(hot, hot.num_tokens)  # kept in use: its blocks are never evicted
    probe = mgr.new_request("probe", hot.all_token_ids)

    best = {"allocate_64": 1e9, "free_64": 1e9, "lookup_64": 1e9}
    for i in range(rounds):
        req = mgr.new_request(f"m{i}", [(1 << 30) + i * 2048 + j for j in range(64 * BS)])
        t = time.perf_counter()
        mgr.allocate_slots(req, req.num_tokens)
        best["allocate_64"] = min(best["allocate_64"], time.perf_counter() - t)
        t = time.perf_counter()
        mgr.free(req)
        best["free_64"] = min(best["free_64"], time.perf_counter() - t)
        t = time.perf_counter()
        hit = mgr.get_computed_blocks(probe)
        best["lookup_64"] = min(best["lookup_64"], time.perf_counter() - t)
        assert hit.num_computed_tokens == 64 * BS
    return {
        "build_s": build_s,
        "bytes_per_block": bytes_per_block,
        **{k: v * 1e6 for k, v in best.items()},
    }


def dict_floor_us(num_keys: int, rounds: int = 200) -> float:
    """Best-of-``rounds`` cost in microseconds of 64 deletes of old keys plus 64 inserts of
    new ones in a dict of ``num_keys`` random 32-byte keys."""
    rng = random.Random(1)
    d = {rng.randbytes(32): i for i in range(num_keys)}
    keys = list(d)
    rng.shuffle(keys)
    best = float("inf")
    for r in range(rounds):
        new = [rng.randbytes(32) for _ in range(64)]
        for k in new:
            hash(k)  # cached in the object: the index's hashes are computed on hashing
        old = keys[r * 64:(r + 1) * 64]
        t = time.perf_counter()
        for k in old:
            del d[k]
        for k in new:
            d.setdefault(k, 0)
        best = min(best, time.perf_counter() - t)
    return best * 1e6


def main() -> None:
    small = measure(10_000)
    large = measure(1_000_000)
    small["dict_floor"] = dict_floor_us(10_000)
    large["dict_floor"] = dict_floor_us(1_000_000)
    if "--json" in sys.argv[1:]:
        print(json.dumps({"10000": small, "1000000": large}))
        return
    print(f"{'':<20} {'10,000 blocks':>14} {'1,000,000 blocks':>17} {'ratio':>7}")
    for key, unit in (
        ("build_s", "s"),
        ("bytes_per_block", "B"),
        ("allocate_64", "us"),
        ("free_64", "us"),
        ("lookup_64", "us"),
        ("dict_floor", "us"),
    ):
        print(
            f"{key + ' (' + unit + ')':<20} {small[key]:>14.3f} {large[key]:>17.3f} "
            f"{large[key] / small[key]:>7.2f}"
        )


if __name__ == "__main__":
    main()
