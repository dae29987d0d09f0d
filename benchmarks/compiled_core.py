#!/usr/bin/env python3
"""The compiled core against the pure-Python core and vLLM 0.33, in one command.

Each round runs the side-by-side harness (``vllm_compare_adapter.py`` / ``vllm_driver.py``,
see ``compare_vllm.py``) once per side (pure core under ``PAGEDKV_PURE=1``, compiled core,
vLLM), rotating which side goes first, on each workload, with ``sha256_cbor`` block hashing
on every side (the same bytes hashed, the same digests). Prints:

1. per workload, the medians over rounds of core ops/s (lookup + allocate + free) and
   core+hash ops/s (adds prompt hashing and token appends) for pure, compiled and vLLM,
   the medians of the per-round ratios to vLLM, and whether the block-id digests of all
   three sides are equal;
2. per call type, the mean microseconds per call, pure vs compiled (median over rounds,
   summed over workloads, weighted by calls), and compiled/pure;
3. per-op cost at 10,000 vs 1,000,000 blocks for both cores (``scaling.py``), unless
   ``--no-scaling``.

``--repeat R`` (R >= 2) has every driver replay the workload R times on fresh managers and
report each call's fastest time over the R replays (``kv_workload.best_call_ns``): the
ratios then compare what each side's code costs, with the pauses a shared machine adds to
single calls left out (as ``hybrid_speed.py``'s ``best``); the call table stays the first
replay's means.

``--cpu N`` pins this process, and so every driver it starts, to CPU ``N``
(``os.sched_setaffinity``, Linux): each side then runs on the same core, and a shared
machine's other work moves the ratio less (it still slows whichever side it meets; more
``--rounds`` give a stabler median).

::

    python benchmarks/compiled_core.py --vllm-python VLLM_PY --rounds 3
    python benchmarks/compiled_core.py --rounds 3                  # without vLLM
    python benchmarks/compiled_core.py --vllm-python VLLM_PY --presets new-request-heavy
    python benchmarks/compiled_core.py --vllm-python VLLM_PY --rounds 5 --cpu 1
    python benchmarks/compiled_core.py --vllm-python VLLM_PY --rounds 3 --repeat 3
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
sys.path.insert(0, HERE)

from compare_vllm import SRC, pagedkv_cmd, run_driver, vllm_cmd  # noqa: E402
from kv_workload import PRESETS  # noqa: E402

SIDES = ("pure", "compiled", "vllm")
CALLS = ("hash_prompt", "lookup", "allocate_prefill", "append_token", "allocate_decode", "free")


def run_side(side: str, flags: list[str], vllm_python: str | None) -> dict[str, Any]:
    """One harness run of ``side``; its JSON result."""
    if side == "vllm":
        assert vllm_python is not None
        return run_driver(vllm_cmd(vllm_python, flags))
    os.environ["PAGEDKV_PURE"] = "1" if side == "pure" else "0"
    try:
        result = run_driver(pagedkv_cmd(flags), SRC)
    finally:
        del os.environ["PAGEDKV_PURE"]
    return result


def check_cores() -> None:
    """Exit when this checkout's compiled core is not built (the table would be pure/pure)."""
    code = "from pagedkv.core import native; print(native.CORE, native.IMPORT_ERROR)"
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("PAGEDKV_PURE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    if not out.startswith("compiled"):
        raise SystemExit(f"the compiled core is not available: {out} "
                         "(build it: pip install -e . or python setup.py build_ext --inplace)")


def med(values: list[float]) -> float:
    return statistics.median(values)


def workload_rows(preset: str, runs: dict[str, list[dict[str, Any]]], has_vllm: bool,
                  best: bool = False) -> None:
    """Table 1's lines for one workload (with ``best``, the best-of-replays rates)."""
    for metric, label in (("core_ops_per_s", "core"), ("core_plus_hash_ops_per_s", "+hash")):
        metric = "best_" + metric if best else metric
        cells = [f"{med([r[metric] for r in runs[s]]):>11,.0f}" for s in SIDES if runs[s]]
        ratios = ""
        if has_vllm:
            for side in ("pure", "compiled"):
                rs = [a[metric] / b[metric] for a, b in zip(runs[side], runs["vllm"],
                                                             strict=True)]
                ratios += f" {med(rs):>6.2f} ({min(rs):.2f}-{max(rs):.2f})"
        print(f"{preset:<15} {label:<6} {' '.join(cells)}{ratios}")
    sides = [s for s in SIDES if runs[s]]
    verdicts = []
    for key in ("workload_digest", "digest_lookup", "digest_alloc"):
        values = {r[key] for s in sides for r in runs[s]}
        verdicts.append(len(values) == 1)
    first = runs["pure"][0]
    print(f"{'':<15} digests of {'/'.join(sides)}: "
          f"{'equal' if all(verdicts) else 'DIFFERENT'} (lookup {first['digest_lookup']}, "
          f"alloc {first['digest_alloc']})")


def call_table(all_runs: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    """Table 2: mean us per call by call type, pure vs compiled."""
    print(f"\n{'call type':<18} {'calls':>9} {'pure us':>9} {'compiled us':>12} "
          f"{'compiled/pure':>14}")
    for call in CALLS:
        totals = {"pure": 0.0, "compiled": 0.0}
        count = 0
        for runs in all_runs.values():
            n = runs["pure"][0]["ops"].get(call, {}).get("count", 0)
            count += n
            for side in totals:
                totals[side] += n * med([r["ops"][call]["mean_us"] for r in runs[side]]
                                        if n else [0.0])
        if count:
            pure, comp = totals["pure"] / count, totals["compiled"] / count
            print(f"{call:<18} {count:>9,} {pure:>9.3f} {comp:>12.3f} {comp / pure:>14.2f}")


def scaling_table() -> None:
    """Table 3: scaling.py on both cores."""
    print(f"\n{'per-op cost (us)':<18} {'core':<9} {'10k blocks':>11} {'1M blocks':>11} "
          f"{'1M/10k':>7}")
    for side in ("pure", "compiled"):
        env = {**os.environ, "PYTHONPATH": SRC, "PAGEDKV_PURE": "1" if side == "pure" else "0"}
        out = subprocess.run([sys.executable, os.path.join(HERE, "scaling.py"), "--json"],
                             capture_output=True, text=True, env=env, check=True).stdout
        res = json.loads(out.strip().splitlines()[-1])
        keys = ["allocate_64", "free_64", "lookup_64"]
        if side == "pure":  # the bare dict does not depend on the core: one line of it
            keys.append("dict_floor")
        for key in keys:
            small, large = res["10000"][key], res["1000000"][key]
            label = "(bare dict 64+64)" if key == "dict_floor" else side
            print(f"{key:<18} {label:<9} {small:>11.2f} {large:>11.2f} {large / small:>7.2f}")


def pin(ap: argparse.ArgumentParser, cpu: int) -> None:
    """Pin this process (and the drivers it starts, which inherit it) to ``cpu``."""
    allowed = getattr(os, "sched_getaffinity", None)
    if allowed is None:
        ap.error("--cpu needs os.sched_setaffinity (Linux)")
    if cpu not in allowed(0):
        ap.error(f"--cpu {cpu}: not one of this process's CPUs {sorted(allowed(0))}")
    os.sched_setaffinity(0, {cpu})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", default=None,
                    help="an interpreter with vLLM 0.33 (without: pure vs compiled only)")
    ap.add_argument("--presets", default=",".join(PRESETS),
                    help=f"comma-separated workloads: {', '.join(PRESETS)}")
    ap.add_argument("--rounds", type=int, default=3, help="rotating rounds (>= 3)")
    ap.add_argument("--no-scaling", action="store_true", help="skip the 10k/1M table")
    ap.add_argument("--repeat", type=int, default=1,
                    help="replays per driver run; >= 2 rates each call's fastest replay")
    ap.add_argument("--cpu", type=int, default=None,
                    help="run every side pinned to this CPU (Linux sched_setaffinity)")
    ap.add_argument("workload", nargs=argparse.REMAINDER, help="-- flags for every driver")
    a = ap.parse_args(argv)
    if a.rounds < 3:
        ap.error("--rounds must be at least 3 (the figures are medians)")
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    presets = a.presets.split(",")
    for preset in presets:
        if preset not in PRESETS:
            ap.error(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if a.cpu is not None:
        pin(ap, a.cpu)
    check_cores()
    extra = [f for f in a.workload if f != "--"]
    if a.repeat > 1:
        extra += ["--repeat", str(a.repeat)]
    sides = [s for s in SIDES if s != "vllm" or a.vllm_python]
    has_vllm = a.vllm_python is not None
    where = f", every side on CPU {a.cpu}" if a.cpu is not None else ""
    how = f", each call's best of {a.repeat} replays" if a.repeat > 1 else ""
    print(f"median of {a.rounds} rotating rounds{how}, sha256_cbor on every side{where} "
          f"{' '.join(extra)}")
    head = " ".join(f"{s + ' ops/s':>11}" for s in sides)
    ratio_head = "  pure/vLLM (range)  compiled/vLLM (range)" if has_vllm else ""
    print(f"{'workload':<15} {'ops':<6} {head}{ratio_head}")
    all_runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for preset in presets:
        flags = ["--preset", preset, "--hash-algo", "sha256_cbor", *extra]
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
        for r in range(a.rounds):
            for k in range(len(sides)):
                side = sides[(r + k) % len(sides)]
                runs[side].append(run_side(side, flags, a.vllm_python))
        all_runs[preset] = runs
        workload_rows(preset, runs, has_vllm, best=a.repeat > 1)
        sys.stdout.flush()
    call_table(all_runs)
    if not a.no_scaling:
        scaling_table()


if __name__ == "__main__":
    main()
