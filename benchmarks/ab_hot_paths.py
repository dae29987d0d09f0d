#!/usr/bin/env python3
"""Per-step code paths, two checkouts side by side: did a restructuring slow one down?

Per checkout a child process times, best of ``--repeat`` each:

* ``register off`` / ``register on``: ``BlockPool.cache_full_blocks`` registering 64
  blocks one call per block (as decode steps do), then evicting them; events off (the
  null recorder) and on (the event buffer); ns per block;
* ``allocate``: one ``allocate_slots`` (its argument checks included) per decode step of
  8 requests of 512 prompt tokens, 64 steps each, then ``free``; ns per call;
* ``hash lookahead``: ``LookaheadBlockHasher(16, lookahead_tokens=2)`` hashing a fresh
  1,024-token prompt, memo off; ns per block.

Rounds alternate the order of the checkouts; the table shows each side's median over
rounds and after / before (below 1: faster).

    python benchmarks/ab_hot_paths.py --before /tmp/pagedkv-main/src --after src
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, random, sys, timeit
sys.path.insert(0, sys.argv[1])
from pagedkv import BlockHasher, CacheConfig, FullAttentionSpec, KVCacheManager, Request
from pagedkv.core.hashing_lookahead import LookaheadBlockHasher
from pagedkv.core.pool import BlockPool
from pagedkv.core.recorder import EventBuffer, GroupInfo
repeat = int(sys.argv[2])

def register(events):
    req = Request("a", list(range(16 * 64 + 1)), hasher=BlockHasher(16))
    groups = [GroupInfo(16, "full_attention", None)]
    rec = EventBuffer(groups, 16) if events else None
    pool = BlockPool(4096, hash_block_size=16, groups=groups, recorder=rec)
    ids = pool.get_new_blocks(64)
    def one():
        for i in range(64):
            pool.cache_full_blocks(req, ids, i, i + 1, 0)
        pool.evict_blocks(ids)
        pool.recorder.take()
    return min(timeit.repeat(one, number=20, repeat=repeat)) / 20 / 64 * 1e9

def allocate():
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
    mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=2048, max_model_len=1024))
    hasher = BlockHasher(16)
    rng = random.Random(0)
    prompts = [[rng.randrange(32000) for _ in range(512)] for _ in range(8)]
    def one():
        reqs = [Request(f"r{i}", p, hasher=hasher) for i, p in enumerate(prompts)]
        for r in reqs:
            mgr.allocate_slots(r, r.num_tokens, new_computed_blocks=mgr.get_computed_blocks(r))
            r.num_computed_tokens = r.num_tokens
        for step in range(64):
            for r in reqs:
                r.append_output_tokens(step)
                mgr.allocate_slots(r, 1)
                r.num_computed_tokens += 1
        for r in reqs:
            mgr.free(r)
        mgr.reset_prefix_cache()
    return min(timeit.repeat(one, number=1, repeat=repeat)) / (8 * 65) * 1e9

def hash_lookahead():
    hasher = LookaheadBlockHasher(16, lookahead_tokens=2, memo_blocks=0)
    rng = random.Random(1)
    prompts = [[rng.randrange(32000) for _ in range(1024)] for _ in range(repeat)]
    best = float("inf")
    for p in prompts:
        hashes = []
        t = timeit.default_timer()
        hasher.extend(hashes, p)
        best = min(best, timeit.default_timer() - t)
    return best / (1022 // 16) * 1e9

print(json.dumps({"register off": register(False), "register on": register(True),
                  "allocate": allocate(), "hash lookahead": hash_lookahead()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the src directory of the baseline")
    ap.add_argument("--after", required=True, help="the src directory of the change")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=15)
    a = ap.parse_args()
    sides = {"before": a.before, "after": a.after}
    got: dict[str, dict[str, list[float]]] = {s: {} for s in sides}
    for r in range(a.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            out = subprocess.run([sys.executable, "-c", CHILD, sides[side], str(a.repeat)],
                                 check=True, capture_output=True, text=True).stdout
            for k, v in json.loads(out).items():
                got[side].setdefault(k, []).append(v)
    print(f"{'path':<16}{'before ns':>12}{'after ns':>12}{'after/before':>14}")
    for k in got["before"]:
        b = statistics.median(got["before"][k])
        f = statistics.median(got["after"][k])
        print(f"{k:<16}{b:12.0f}{f:12.0f}{f / b:14.3f}")


if __name__ == "__main__":
    main()
