#!/usr/bin/env python3
"""pagedkv vs vLLM 0.33 on the hybrid layouts, two checkouts side by side: the speed
column of the differential suite (``python -m conformance``), median of rotating rounds.

The suite times every manager call of both sides operation by operation (vLLM first, then
pagedkv, on the same state), so its ``speed_vs_vllm`` ratio is already a same-run figure;
this script runs the suite once per checkout per round, alternating which checkout goes
first, and prints per layout the median ratio of each checkout and every round's value.
Any divergence fails the run (the figures would not be comparable).

    python benchmarks/hybrid_speed.py --vllm-python /path/to/venv-vllm/bin/python \\
        --before /tmp/pagedkv-main --after . --rounds 3 --seeds 20

``--before`` may be left out to time one checkout. The interpreter running this script
must have pagedkv's dependencies (msgpack); each checkout runs its own ``conformance``
package and ``src`` (the suite puts both on the path).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

HYBRID = (
    "swa,chunked,full+swa,full+chunked,full+mamba,full+swa+mamba,full32+swa16,full32+swa8"
)
_LINE = re.compile(r"^(\S+)\s+(OK|DIVERGED)\s.*speed_vs_vllm=([0-9.]+)x")


def run_suite(checkout: str, vllm_python: str, args: argparse.Namespace) -> dict[str, float]:
    """One suite run in ``checkout``: layout -> pagedkv / vLLM ratio. Exits on a
    divergence or a failed run."""
    cmd = [sys.executable, "-m", "conformance", "--vllm-python", vllm_python,
           "--layouts", args.layouts, "--seeds", str(args.seeds), "--ops", str(args.ops)]
    proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, check=False)
    ratios: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        if m.group(2) != "OK":
            sys.exit(f"hybrid_speed: {checkout}: {line}")
        ratios[m.group(1)] = float(m.group(3))
    if proc.returncode != 0 or not ratios:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        sys.exit(f"hybrid_speed: the suite failed in {checkout}: {' | '.join(tail)}")
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vllm-python", required=True, help="python of a venv with vLLM 0.33")
    ap.add_argument("--before", help="pagedkv checkout to compare with (optional)")
    ap.add_argument("--after", default=".", help="pagedkv checkout (default: this one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--layouts", default=HYBRID, help="comma-separated suite layouts")
    a = ap.parse_args()
    sides = {"after": os.path.abspath(a.after)}
    if a.before:
        sides = {"before": os.path.abspath(a.before), **sides}
    names = list(sides)
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            runs[n].append(run_suite(sides[n], a.vllm_python, a))
            print(f"round {r + 1} {n}: " + " ".join(
                f"{k}={v:.2f}" for k, v in runs[n][-1].items()), file=sys.stderr, flush=True)
    print(f"pagedkv / vLLM 0.33 core ops/s (suite timing), {a.seeds} seeds x {a.ops} ops, "
          f"median of {a.rounds} rotating rounds")
    header = f"{'layout':<16}" + "".join(f" {n:>8}" for n in names)
    print(header + "   rounds")
    for lay in runs[names[-1]][0]:
        meds = [statistics.median(run[lay] for run in runs[n]) for n in names]
        rounds = "; ".join(
            n + " " + ",".join(f"{run[lay]:.2f}" for run in runs[n]) for n in names
        )
        print(f"{lay:<16}" + "".join(f" {m:>7.2f}x" for m in meds) + f"   {rounds}")


if __name__ == "__main__":
    main()
