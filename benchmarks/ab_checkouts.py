#!/usr/bin/env python3
"""Two pagedkv checkouts against vLLM on the harness workload, rotating: did a change make
pagedkv slower or change a block id?

Each round runs three drivers once, in an order that rotates from round to round (before,
after, vLLM; after, vLLM, before; ...), so a slow minute of the shared machine falls on
every side alike. Both checkouts run through this checkout's harness
(``kv_workload.py`` + ``vllm_compare_adapter.py``) with their own ``src`` first on
``PYTHONPATH`` (the interpreter is this one), so only the library differs. Per side: the
median over rounds of ``core_ops_per_s`` and ``core_plus_hash_ops_per_s``, and the median
of the per-round ratios to vLLM (each ratio taken within one round). Digests must be equal
across rounds and sides::

    python benchmarks/ab_checkouts.py --vllm-python VLLM_PY --before /tmp/pagedkv-main \\
        --after . --rounds 3 -- --preset heavy-eviction

Everything after ``--`` goes to all three drivers (``--preset NAME`` or workload flags,
see ``kv_workload.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from compare_vllm import METRICS, pagedkv_cmd, run_driver, vllm_cmd  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vllm-python", required=True, help="an interpreter with vLLM 0.33")
    ap.add_argument("--before", required=True, help="pagedkv checkout measured first")
    ap.add_argument("--after", required=True, help="pagedkv checkout compared with it")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("workload", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    flags = [f for f in a.workload if f != "--"]
    for checkout in (a.before, a.after):
        if not os.path.isdir(os.path.join(checkout, "src", "pagedkv")):
            ap.error(f"{checkout} is not a pagedkv checkout (no src/pagedkv)")
    sides = {
        "before": lambda: run_driver(pagedkv_cmd(flags),
                                     os.path.join(os.path.abspath(a.before), "src")),
        "after": lambda: run_driver(pagedkv_cmd(flags),
                                    os.path.join(os.path.abspath(a.after), "src")),
        "vllm": lambda: run_driver(vllm_cmd(a.vllm_python, flags)),
    }
    names = list(sides)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(a.rounds):
        for n in names[r % 3:] + names[: r % 3]:
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
    for d in ("workload_digest", "digest_lookup", "digest_alloc"):
        seen = {n: sorted({run[d] for run in runs[n]}) for n in names}
        same = len({v for vals in seen.values() for v in vals}) == 1
        print(f"{d:<26} {' / '.join(f'{n}={v}' for n, v in seen.items())} "
              f"{'equal' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
