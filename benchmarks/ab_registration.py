#!/usr/bin/env python3
"""What one registration costs the pool (``BlockPool.cache_full_blocks``), two checkouts
side by side: did a change to how the pool tells its recorder slow it down?

Per checkout, a child process registers 64 blocks one call per block (as decode steps do)
and evicts them again, events off (the null recorder) and on (the event buffer); best of
``--repeat`` per round; rounds alternate the order of the checkouts, and the table shows
each side's median over rounds, in ns per registered block (registration plus eviction).

    python benchmarks/ab_registration.py --before /tmp/pagedkv-main/src --after src
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, timeit
sys.path.insert(0, sys.argv[1])
from pagedkv import BlockHasher, Request
from pagedkv.core.pool import BlockPool
from pagedkv.core.recorder import EventBuffer, GroupInfo

def measure(events, repeat):
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

repeat = int(sys.argv[2])
print(json.dumps({"off": measure(False, repeat), "on": measure(True, repeat)}))
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
    got: dict[str, dict[str, list[float]]] = {s: {"off": [], "on": []} for s in sides}
    for r in range(a.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            out = subprocess.run([sys.executable, "-c", CHILD, sides[side], str(a.repeat)],
                                 check=True, capture_output=True, text=True).stdout
            for k, v in json.loads(out).items():
                got[side][k].append(v)
    print(f"{'events':<8}{'before ns/block':>16}{'after ns/block':>16}{'after/before':>14}")
    for k in ("off", "on"):
        b = statistics.median(got["before"][k])
        f = statistics.median(got["after"][k])
        print(f"{k:<8}{b:16.0f}{f:16.0f}{f / b:14.3f}")


if __name__ == "__main__":
    main()
