"""Start-up of vLLM 0.33's scheduler: stock, pagedkv's (its manager built where vLLM's
constructor builds its own, so vLLM's is never built) and, for comparison, pagedkv's
manager built after a stock constructor (what pagedkv did before: two pools).

Run under an interpreter with vLLM (CPU build) and pagedkv importable::

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=src $V benchmarks/vllm_startup.py --num-blocks 100000

Each round builds one scheduler per side, sides alternating (the first side rotates).
Printed per side: the median construction time over the rounds (milliseconds), the peak
of Python memory allocated during one construction (``tracemalloc``, a separate build,
MiB) and how many vLLM ``BlockPool`` objects and pagedkv managers one construction built.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from pagedkv.vllm import harness  # noqa: E402

CONFIG_JSON = REPO / "conformance" / "data" / "opt-125m-config.json"


def _counting(cls: Any, counts: dict[str, int], name: str) -> None:
    """Count constructions of ``cls`` in ``counts[name]``."""
    init = cls.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        counts[name] += 1
        init(self, *args, **kwargs)

    cls.__init__ = counted


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--num-blocks", type=int, default=100_000)
    args = p.parse_args()
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.sched.scheduler import Scheduler

    from pagedkv.core.manager import KVCacheManager
    from pagedkv.vllm import PagedKVScheduler
    from pagedkv.vllm.scheduler import install_pagedkv

    counts = {"vllm_pools": 0, "pagedkv_managers": 0}
    _counting(BlockPool, counts, "vllm_pools")
    _counting(KVCacheManager, counts, "pagedkv_managers")

    with tempfile.TemporaryDirectory() as tmp:
        model = harness.model_dir(CONFIG_JSON, Path(tmp))

        def build(side: str) -> Any:
            cls = PagedKVScheduler if side == "pagedkv" else Scheduler
            s = harness.build_scheduler(model, cls, async_scheduling=False,
                                        num_blocks=args.num_blocks, window=None,
                                        max_model_len=2048)
            if side == "pagedkv after stock":
                install_pagedkv(s)
            return s

        sides = ["stock", "pagedkv", "pagedkv after stock"]
        build("stock")  # warm-up: imports, vLLM's config caches
        times: dict[str, list[float]] = {k: [] for k in sides}
        for rnd in range(args.rounds):
            shift = rnd % len(sides)
            for side in sides[shift:] + sides[:shift]:
                gc.collect()
                t0 = time.perf_counter()
                s = build(side)
                times[side].append((time.perf_counter() - t0) * 1e3)
                del s
        rows = []
        for side in sides:
            gc.collect()
            for k in counts:
                counts[k] = 0
            tracemalloc.start()
            s = build(side)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            del s
            rows.append((side, statistics.median(times[side]), min(times[side]),
                         max(times[side]), peak / 2**20, dict(counts)))
    print(f"vLLM scheduler start-up, {args.num_blocks} blocks (opt-125m config, one "
          f"full-attention group), median of {args.rounds} alternating rounds")
    print("| side | ms (median) | ms range | peak MiB (tracemalloc) | vLLM BlockPools "
          "| pagedkv managers |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for side, med, lo, hi, mib, c in rows:
        print(f"| {side} | {med:.0f} | {lo:.0f}-{hi:.0f} | {mib:.1f} | {c['vllm_pools']} "
              f"| {c['pagedkv_managers']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
