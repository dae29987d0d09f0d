#!/usr/bin/env python3
"""Two pagedkv checkouts against vLLM on the side-by-side harness, alternating: did a
change make pagedkv slower or change a block id?

Each round runs the three drivers once, in an order that rotates from round to round
(before, after, vLLM; after, vLLM, before; ...), so a slow minute of the shared machine
falls on every side alike. Per side: the median over rounds of ``core_ops_per_s`` and
``core_plus_hash_ops_per_s``, and the median of the per-round ratios to vLLM (each ratio
taken within one round). Digests must be equal across rounds and sides.

    python benchmarks/ab_checkouts.py --vllm-python /path/to/venv-vllm/bin/python \\
        --before /tmp/pagedkv-main --after . --rounds 3 -- --num-blocks 1500

Each checkout runs with its own ``benchmarks/vllm_compare_adapter.py`` and ``src`` on
``PYTHONPATH`` (the interpreter is this one). Everything after ``--`` goes to all drivers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "bench", "vllm_compare"))
METRICS = ("core_ops_per_s", "core_plus_hash_ops_per_s")


def _run(cmd: list[str], cwd: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True,
                         env=env).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _pagedkv(checkout: str, harness: str, flags: list[str]) -> dict[str, Any]:
    checkout = os.path.abspath(checkout)
    env = dict(os.environ, PYTHONPATH=os.path.join(checkout, "src"))
    adapter = os.path.join(checkout, "benchmarks", "vllm_compare_adapter.py")
    return _run([sys.executable, adapter, "--harness-dir", harness, *flags], harness, env)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vllm-python", required=True, help="python of a venv with vllm")
    ap.add_argument("--before", required=True, help="pagedkv checkout measured first")
    ap.add_argument("--after", required=True, help="pagedkv checkout compared with it")
    ap.add_argument("--harness-dir", default=HARNESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("workload", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    flags = [f for f in a.workload if f != "--"]
    harness = os.path.abspath(a.harness_dir)
    sides = {
        "before": lambda: _pagedkv(a.before, harness, flags),
        "after": lambda: _pagedkv(a.after, harness, flags),
        "vllm": lambda: _run([a.vllm_python, os.path.join(harness, "drive_vllm.py"), *flags],
                             harness),
    }
    names = list(sides)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % 3:] + names[: r % 3]
        for n in order:
            runs[n].append(sides[n]())
    print(f"workload: {' '.join(flags) or '(default)'}; median of {a.rounds} rotating rounds")
    print(f"{'metric':<26} {'side':<7} {'ops/s':>12} {'ratio to vLLM':>14}")
    for m in METRICS:
        for n in names:
            ops = statistics.median(run[m] for run in runs[n])
            ratio = (statistics.median(run[m] / v[m] for run, v in zip(runs[n], runs["vllm"],
                                                                       strict=True))
                     if n != "vllm" else 1.0)
            print(f"{m:<26} {n:<7} {ops:>12,.0f} {ratio:>14.3f}")
    for d in ("digest_lookup", "digest_alloc"):
        seen = {n: sorted({run[d] for run in runs[n]}) for n in names}
        same = len({v for vals in seen.values() for v in vals}) == 1
        print(f"{d:<26} {' / '.join(f'{n}={v}' for n, v in seen.items())} "
              f"{'equal' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
