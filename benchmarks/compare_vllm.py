#!/usr/bin/env python3
"""Run pagedkv and vLLM's KV-cache manager on the same harness workload, alternating, and
print one table row per metric: best-of-N for each side, the ratio, and whether the digests
(hit lengths + hit block ids, and every allocated block id) are equal.

Best-of-N (not mean) because on a shared 2-core machine other processes only ever slow a
run down; alternating the two sides spreads any drift over both.

    python benchmarks/compare_vllm.py --vllm-python /path/to/venv-vllm/bin/python \\
        --rounds 3 -- --trace ../../data/traces/conversation_trace.jsonl \\
        --trace-limit 1000 --concurrency 16

Everything after ``--`` goes to both drivers unchanged (see the harness's workload flags).
See benchmarks/README.md for installing vLLM on a CPU-only machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "bench", "vllm_compare"))
METRICS = ("core_ops_per_s", "core_plus_hash_ops_per_s")


def _run(cmd: list[str], cwd: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vllm-python", required=True, help="python of a venv with vllm")
    ap.add_argument("--harness-dir", default=HARNESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--hash-algo-pagedkv",
        default=None,
        help="hash algo for pagedkv only (e.g. xxhash), vLLM keeps the default",
    )
    ap.add_argument("workload", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    flags = [f for f in a.workload if f != "--"]
    pk_flags = list(flags)
    if a.hash_algo_pagedkv:
        pk_flags += ["--hash-algo", a.hash_algo_pagedkv]
    pk_cmd = [
        sys.executable,
        os.path.join(HERE, "vllm_compare_adapter.py"),
        "--harness-dir",
        a.harness_dir,
        *pk_flags,
    ]
    vl_cmd = [a.vllm_python, os.path.join(a.harness_dir, "drive_vllm.py"), *flags]
    pk_runs, vl_runs = [], []
    for _ in range(a.rounds):
        pk_runs.append(_run(pk_cmd, a.harness_dir))
        vl_runs.append(_run(vl_cmd, a.harness_dir))
    print(f"workload: {' '.join(flags) or '(default)'}; best of {a.rounds} alternating runs")
    print(f"{'metric':<26} {'pagedkv':>12} {'vllm':>12} {'ratio':>7}")
    for m in METRICS:
        p = max(r[m] for r in pk_runs)
        v = max(r[m] for r in vl_runs)
        print(f"{m:<26} {p:>12,.0f} {v:>12,.0f} {p / v:>7.2f}")
    for d in ("digest_lookup", "digest_alloc"):
        ps = {r[d] for r in pk_runs}
        vs = {r[d] for r in vl_runs}
        same = "equal" if ps == vs and len(ps) == 1 else "DIFFERENT"
        print(f"{d:<26} {'/'.join(sorted(ps)):>12} {'/'.join(sorted(vs)):>12} {same:>7}")
    print(f"{'hit_rate':<26} {pk_runs[0]['hit_rate']:>12} {vl_runs[0]['hit_rate']:>12}")


if __name__ == "__main__":
    main()
