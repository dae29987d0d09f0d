"""Wall time of ``pagedkv simulate --replicas N`` against ``pagedkv simulate`` on the same
requests (the bundled default unless arguments after ``--`` say otherwise), alternating
the two in each round, median of ``--runs`` rounds, and the same-round ratio.

    python benchmarks/replicas_speed.py --replicas 4 --runs 3

Both runs skip the bounds (``--no-bounds``) and the capacity search (``--no-find-capacity``):
the replays alone are compared, and plots;
the replica run routes round-robin (one policy, not the three of ``compare``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def one_run(args: list[str]) -> float:
    """Wall seconds of one ``python -m pagedkv simulate ARGS`` (output discarded)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pagedkv", "simulate", *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("extra", nargs="*", help="more simulate arguments (after --)")
    a = p.parse_args()
    base = ["--no-plots", "--no-progress", "--no-bounds", "--no-find-capacity", *a.extra]
    many = [*base, "--replicas", str(a.replicas), "--router", "round-robin"]
    single_s: list[float] = []
    replicas_s: list[float] = []
    for i in range(a.runs):
        single_s.append(one_run(base))
        replicas_s.append(one_run(many))
        print(f"round {i + 1}: simulate {single_s[-1]:.2f} s, --replicas {a.replicas} "
              f"{replicas_s[-1]:.2f} s, ratio {replicas_s[-1] / single_s[-1]:.2f}", flush=True)
    ratios = [r / s for r, s in zip(replicas_s, single_s, strict=True)]
    print(f"median: simulate {statistics.median(single_s):.2f} s, --replicas {a.replicas} "
          f"{statistics.median(replicas_s):.2f} s, same-round ratio "
          f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
