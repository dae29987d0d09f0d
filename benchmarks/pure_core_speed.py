#!/usr/bin/env python3
"""The pure-Python core of this checkout against the pure-Python core of an earlier commit,
on the harness workloads: did a change slow the reference core down?

The earlier commit's ``src`` is exported with ``git archive`` into a temporary directory (no
build: the pure core is plain Python). Each round runs the harness driver
(``vllm_compare_adapter.py``, this checkout's harness) once per side under
``PAGEDKV_PURE=1``, the side that goes first alternating from round to round, with only
``PYTHONPATH`` differing; a run replays the workload ``--best-of`` times on fresh managers
(the driver's ``--repeat``) and counts its fastest replay, so a pause of the shared
machine during one replay does not decide the round. Printed per workload: each side's
median ``core_ops_per_s`` and ``core_plus_hash_ops_per_s`` over rounds, the median (and
range) of the per-round ratio this checkout / earlier commit (above 1: this checkout is
faster), and whether the block-id digests are equal. With ``--ops``, also one line per
core call type (lookup, prefill and decode allocation, free): each side's median mean
microseconds per call and the median per-round ratio earlier / this (above 1: this
checkout's call is faster), to say which call type moved::

    python benchmarks/pure_core_speed.py --baseline ded63ff --rounds 5
    python benchmarks/pure_core_speed.py --baseline ded63ff --rounds 7 --best-of 3 --ops
    python benchmarks/pure_core_speed.py --baseline ded63ff --presets mooncake -- \\
        --num-requests 500

Flags after ``--`` go to every driver run (see ``kv_workload.py``).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from compare_vllm import METRICS, SRC, pagedkv_cmd, run_driver  # noqa: E402
from kv_workload import CORE_OPS  # noqa: E402

DIGESTS = ("workload_digest", "digest_lookup", "digest_alloc")


def export_src(commit: str, into: str) -> str:
    """``commit``'s ``src`` tree under ``into``; returns the path of that ``src``."""
    repo = os.path.dirname(HERE)
    proc = subprocess.run(["git", "-C", repo, "archive", "--format=tar", commit, "src"],
                          capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"pure_core_speed: git archive {commit} failed: "
                         f"{proc.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(into, filter="data")
    return os.path.join(into, "src")


def fastest(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` with each metric the best of its replays (``repeats_<metric>``, present
    with ``--repeat`` above 1); the per-call figures stay the first replay's."""
    return {**run, **{m: max(run.get(f"repeats_{m}", [run[m]])) for m in METRICS}}


def measure(srcs: dict[str, str], flags: list[str], rounds: int) -> dict[str, list[Any]]:
    """``rounds`` runs per side, the first side alternating."""
    names = list(srcs)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % 2:] + names[: r % 2]:
            runs[n].append(fastest(run_driver(pagedkv_cmd(flags), srcs[n])))
    return runs


def report(preset: str, runs: dict[str, list[dict[str, Any]]], ops: bool = False) -> None:
    """One line per metric (per core call type too with ``ops``), then the digests'
    verdict."""
    for m in METRICS:
        base = statistics.median(r[m] for r in runs["baseline"])
        now = statistics.median(r[m] for r in runs["this"])
        ratios = [a[m] / b[m] for a, b in zip(runs["this"], runs["baseline"], strict=True)]
        print(f"{preset:<16} {m:<26} {base:>12,.0f} {now:>12,.0f} "
              f"{statistics.median(ratios):>7.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    for op in CORE_OPS if ops else ():
        base_us = [r["ops"][op]["mean_us"] for r in runs["baseline"]]
        now_us = [r["ops"][op]["mean_us"] for r in runs["this"]]
        ratios = [b / a for a, b in zip(now_us, base_us, strict=True)]
        print(f"{preset:<16} {op + '_us':<26} {statistics.median(base_us):>12,.2f} "
              f"{statistics.median(now_us):>12,.2f} {statistics.median(ratios):>7.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")
    same = all(len({r[d] for side in runs.values() for r in side}) == 1 for d in DIGESTS)
    print(f"{preset:<16} digests {'equal' if same else 'DIFFERENT'}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--baseline", required=True, help="the earlier commit (any git revision)")
    ap.add_argument("--presets", default="shared-prompt,heavy-eviction,mooncake,new-requests")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (>= 3)")
    ap.add_argument("--best-of", type=int, default=1,
                    help="replays per run, the fastest counted (default 1)")
    ap.add_argument("--ops", action="store_true",
                    help="also each core call type's microseconds per call")
    ap.add_argument("workload", nargs=argparse.REMAINDER, help="-- flags for every driver")
    a = ap.parse_args(argv)
    if a.rounds < 3:
        ap.error("--rounds must be at least 3 (the figure is a median)")
    if a.best_of < 1:
        ap.error("--best-of must be at least 1")
    extra = [f for f in a.workload if f != "--"]
    os.environ["PAGEDKV_PURE"] = "1"  # inherited by every driver run
    with tempfile.TemporaryDirectory(prefix="pagedkv-baseline-") as tmp:
        srcs = {"baseline": export_src(a.baseline, tmp), "this": SRC}
        print(f"pure core, this checkout / {a.baseline}: median of {a.rounds} alternating "
              f"rounds, best of {a.best_of} replays each, sha256_cbor {' '.join(extra)}")
        print(f"{'workload':<16} {'metric':<26} {'baseline':>12} {'this':>12} "
              f"{'ratio':>7} (range)")
        for preset in a.presets.split(","):
            flags = ["--preset", preset, "--hash-algo", "sha256_cbor",
                     "--repeat", str(a.best_of), *extra]
            report(preset, measure(srcs, flags, a.rounds), a.ops)


if __name__ == "__main__":
    main()
