#!/usr/bin/env python3
"""pagedkv against vLLM's own KV-cache manager on the harness workloads, side by side.

For each workload, ``--rounds`` rounds; each round runs ``vllm_compare_adapter.py``
(pagedkv, this interpreter, this checkout's ``src``) and ``vllm_driver.py`` (vLLM, under
``--vllm-python``) once each, alternating which goes first. Printed per workload: the
median over rounds of each side's ``core_ops_per_s`` (lookup + allocate + free calls over
their summed time) and ``core_plus_hash_ops_per_s`` (adds prompt hashing and token
appends), the median (and range) of the per-round ratios (each taken within one round), and
whether the block-id digests are equal (the same hits and the same new block ids for every
request: block-id-exact behaviour)::

    python benchmarks/compare_vllm.py --vllm-python VLLM_PY --rounds 3
    python benchmarks/compare_vllm.py --vllm-python VLLM_PY --presets mooncake \\
        --hash-algo-pagedkv xxhash
    python benchmarks/compare_vllm.py --vllm-python VLLM_PY --presets shared-prompt \\
        -- --num-requests 500

Workloads (``kv_workload.PRESETS``): ``shared-prompt`` (2,000 requests sharing a 1,024-token
system prompt), ``heavy-eviction`` (1,500 blocks, 8 system prompts, 80 % shared),
``mooncake`` (1,000 requests of the bundled Mooncake conversation trace, 16 running; a
different trace with ``-- --trace PATH``). Flags after ``--`` go to both drivers.
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

from kv_workload import PRESETS  # noqa: E402

METRICS = ("core_ops_per_s", "core_plus_hash_ops_per_s")
SRC = os.path.join(os.path.dirname(HERE), "src")


def run_driver(cmd: list[str], src: str | None = None) -> dict[str, Any]:
    """Run one driver; its JSON line (the last line of its output)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"{os.path.basename(cmd[1])} failed (exit {proc.returncode}): "
                         f"{tail[0]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def pagedkv_cmd(flags: list[str]) -> list[str]:
    return [sys.executable, os.path.join(HERE, "vllm_compare_adapter.py"), *flags]


def vllm_cmd(python: str, flags: list[str]) -> list[str]:
    return [python, os.path.join(HERE, "vllm_driver.py"), *flags]


def ratio_line(metric: str, runs: dict[str, list[dict[str, Any]]], side: str) -> str:
    """``metric side-median vllm-median ratio-median (min-max)`` for one side."""
    ours = [r[metric] for r in runs[side]]
    theirs = [r[metric] for r in runs["vllm"]]
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return (f"{metric:<26} {statistics.median(ours):>12,.0f} {statistics.median(theirs):>12,.0f}"
            f" {statistics.median(ratios):>7.2f}  ({min(ratios):.2f}-{max(ratios):.2f})")


def digest_line(runs: dict[str, list[dict[str, Any]]]) -> str:
    parts, seen = [], set()
    for key in ("workload_digest", "digest_lookup", "digest_alloc"):
        values = {r[key] for rs in runs.values() for r in rs}
        seen.add(len(values) == 1)
        parts.append(f"{key}={'/'.join(sorted(values))}")
    verdict = "equal" if seen == {True} else "DIFFERENT"
    return f"{'block-id digests':<26} {verdict}: {' '.join(parts)}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", required=True, help="an interpreter with vLLM 0.33")
    ap.add_argument("--presets", default=",".join(PRESETS),
                    help=f"comma-separated workloads: {', '.join(PRESETS)}")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (>= 3)")
    ap.add_argument("--hash-algo-pagedkv", default=None,
                    help="hash for pagedkv only (e.g. xxhash); vLLM keeps --hash-algo")
    ap.add_argument("workload", nargs=argparse.REMAINDER, help="-- flags for both drivers")
    a = ap.parse_args(argv)
    if a.rounds < 3:
        ap.error("--rounds must be at least 3 (the figures are medians)")
    extra = [f for f in a.workload if f != "--"]
    for preset in a.presets.split(","):
        if preset not in PRESETS:
            ap.error(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        flags = ["--preset", preset, *extra]
        pk_flags = flags + (["--hash-algo", a.hash_algo_pagedkv] if a.hash_algo_pagedkv else [])
        runs: dict[str, list[dict[str, Any]]] = {"pagedkv": [], "vllm": []}
        for r in range(a.rounds):
            order = ("pagedkv", "vllm") if r % 2 == 0 else ("vllm", "pagedkv")
            for side in order:
                cmd = pagedkv_cmd(pk_flags) if side == "pagedkv" else vllm_cmd(a.vllm_python,
                                                                               flags)
                runs[side].append(run_driver(cmd, SRC if side == "pagedkv" else None))
        first = runs["pagedkv"][0]
        print(f"workload {preset} {' '.join(extra)}: {first['num_requests']} requests, "
              f"workload digest {first['workload_digest']}, hit rate {first['hit_rate']:.3f}; "
              f"median of {a.rounds} alternating rounds")
        print(f"{'metric':<26} {'pagedkv':>12} {'vllm':>12} {'ratio':>7}  (range)")
        for metric in METRICS:
            print(ratio_line(metric, runs, "pagedkv"))
        print(digest_line(runs), flush=True)


if __name__ == "__main__":
    main()
