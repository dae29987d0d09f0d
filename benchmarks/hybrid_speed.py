#!/usr/bin/env python3
"""pagedkv vs vLLM 0.33 on the hybrid layouts: the differential suite's operations,
replayed and timed on both sides; optionally two pagedkv checkouts side by side.

The suite (``python -m conformance``) sums every manager call's time on each side. On a
loaded machine one descheduling of a 50 us call adds milliseconds to whichever side was
running, so its ``speed_vs_vllm`` column moves by +-30 % from run to run. Here each seed's
operation sequence is recorded once (both sides driven by the suite's own ``run_seed``,
compared after every operation, so a divergence stops the run) and then replayed
``--reps`` times on fresh managers of each side, sides alternating. Timed are the same
calls the suite times (new request, token append, lookup, allocate, free, preempt, new
step, reset). Per layout two ratios, vLLM time / pagedkv time (higher: pagedkv faster):

* ``best``: each operation's fastest of the reps, summed (what the code costs);
* ``median``: the median over reps of each rep's total (what a run costs, pauses in).

With ``--before`` (repeatable), each round runs every checkout (order rotating) and the
table shows the median over rounds of each checkout's ``best`` ratio, and every round's
value. Checkouts are named by their directory.

    python benchmarks/hybrid_speed.py --vllm-python /path/to/venv-vllm/bin/python \\
        --before /tmp/pagedkv-main --after . --rounds 3 --seeds 20

The interpreter running this script must have pagedkv's dependencies (msgpack, for the
events both sides emit); every checkout runs its own ``conformance`` package and ``src``
under ``--vllm-python``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HYBRID = (
    "swa,chunked,full+swa,full+chunked,full+mamba,full+swa+mamba,full32+swa16,full32+swa8"
)


# ---------------------------------------------------------------- worker (under vLLM)


def _record(layout: Any, seed: int, ops: int) -> list[tuple[str, tuple[Any, ...]]]:
    """The suite's calls for one seed (both sides driven and compared), in order; a
    ``None`` method marks the end of an operation."""
    from conformance.pagedkv_side import PagedSide
    from conformance.vllm_side import VllmSide

    from conformance import workload

    calls: list[tuple[str, tuple[Any, ...]]] = []
    real_call = workload._Pair.call

    def call(pair: Any, what: str, method: str, *args: Any) -> Any:
        calls.append((method, args))
        return real_call(pair, what, method, *args)

    real_compare = workload._compare

    def compare(sa: Any, sb: Any, ignore: frozenset[str]) -> None:
        calls.append(("", ()))
        real_compare(sa, sb, ignore)

    workload._Pair.call = call  # type: ignore[method-assign]
    workload._compare = compare
    try:
        res = workload.run_seed(layout, seed, ops, VllmSide(layout), PagedSide(layout))
    finally:
        workload._Pair.call = real_call  # type: ignore[method-assign]
        workload._compare = real_compare
    if res.divergence is not None:
        d = res.divergence
        sys.exit(f"hybrid_speed: {layout.name} seed {d.seed} op {d.op_index} diverged: "
                 f"{d.detail[:300]}")
    return calls


def _replay(side: Any, calls: list[tuple[str, tuple[Any, ...]]], untimed: frozenset[str]
            ) -> list[dict[str, float]]:
    """Seconds per operation of ``side`` replaying ``calls``, per timed method."""
    clock = time.perf_counter
    out: list[dict[str, float]] = []
    t: dict[str, float] = {}
    for method, args in calls:
        if not method:
            side.mgr.take_events()  # what the suite's snapshot does to the event buffers
            out.append(t)
            t = {}
        elif method in untimed:
            getattr(side, method)(*args)
        else:
            f = getattr(side, method)
            t0 = clock()
            f(*args)
            t[method] = t.get(method, 0.0) + clock() - t0
    return out


def worker(layouts: list[str], seeds: int, ops: int, reps: int) -> None:
    """Print one JSON line: layout -> {"best": ratio, "median": ratio, "per_op": {method:
    ratio of the per-operation bests summed over that method's calls}}."""
    from conformance.layouts import layout_by_name
    from conformance.pagedkv_side import PagedSide
    from conformance.vllm_side import VllmSide

    from conformance import workload

    untimed = frozenset(workload._UNTIMED)
    result: dict[str, dict[str, Any]] = {}
    for name in layouts:
        lay = layout_by_name(name)
        best = {"vllm": 0.0, "pagedkv": 0.0}
        per_method: dict[str, dict[str, float]] = {"vllm": {}, "pagedkv": {}}
        totals: dict[str, list[float]] = {"vllm": [0.0] * reps, "pagedkv": [0.0] * reps}
        for seed in range(seeds):
            calls = _record(lay, seed, ops)
            per_op: dict[str, list[list[dict[str, float]]]] = {"vllm": [], "pagedkv": []}
            for r in range(reps):
                order = [("vllm", VllmSide), ("pagedkv", PagedSide)]
                for side_name, cls in order if r % 2 == 0 else order[::-1]:
                    times = _replay(cls(lay), calls, untimed)
                    per_op[side_name].append(times)
                    totals[side_name][r] += sum(sum(t.values()) for t in times)
            for side_name, runs in per_op.items():
                for op_runs in zip(*runs, strict=True):
                    fastest = min(op_runs, key=lambda t: sum(t.values()))
                    best[side_name] += sum(fastest.values())
                    acc = per_method[side_name]
                    for method, secs in fastest.items():
                        acc[method] = acc.get(method, 0.0) + secs
        result[name] = {
            "best": best["vllm"] / best["pagedkv"],
            "median": statistics.median(totals["vllm"]) / statistics.median(totals["pagedkv"]),
            "per_op": {m: per_method["vllm"][m] / per_method["pagedkv"][m]
                       for m in sorted(per_method["pagedkv"])
                       if per_method["pagedkv"][m] > 0 and m in per_method["vllm"]},
        }
    print(json.dumps(result))


# ---------------------------------------------------------------- driver


def _msgpack_dir() -> str:
    spec = importlib.util.find_spec("msgpack")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("hybrid_speed: this interpreter lacks msgpack; run it from pagedkv's venv")
    out = tempfile.mkdtemp(prefix="hybrid-speed-msgpack-")
    os.symlink(next(iter(spec.submodule_search_locations)), os.path.join(out, "msgpack"))
    return out


def run_checkout(checkout: str, a: argparse.Namespace, extra_path: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join((checkout, os.path.join(checkout, "src"), extra_path))
    env.pop("PYTHONHASHSEED", None)
    cmd = [a.vllm_python, os.path.abspath(__file__), "--worker", "--layouts", a.layouts,
           "--seeds", str(a.seeds), "--ops", str(a.ops), "--reps", str(a.reps)]
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        sys.exit(f"hybrid_speed: {checkout}: {' | '.join(tail)}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vllm-python", help="python of a venv with vLLM 0.33")
    ap.add_argument("--before", action="append", default=[],
                    help="pagedkv checkout to compare with (optional, repeatable)")
    ap.add_argument("--after", default=".", help="pagedkv checkout (default: this one)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--reps", type=int, default=5, help="replays per side and seed")
    ap.add_argument("--layouts", default=HYBRID, help="comma-separated suite layouts")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.layouts.split(","), a.seeds, a.ops, a.reps)
        return
    if not a.vllm_python:
        ap.error("--vllm-python is required")
    if os.sep in a.vllm_python:  # a path: the workers run in each checkout's directory
        a.vllm_python = os.path.abspath(a.vllm_python)
    paths = [os.path.abspath(p) for p in (*a.before, a.after)]
    sides = {os.path.basename(p) or p: p for p in paths}
    if len(sides) != len(paths):
        sides = {f"side{i}": p for i, p in enumerate(paths)}
    names = list(sides)
    extra = _msgpack_dir()
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(a.rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            runs[n].append(run_checkout(sides[n], a, extra))
            print(f"round {r + 1} {n}: " + " ".join(
                f"{k}={v['best']:.2f}/{v['median']:.2f}" for k, v in runs[n][-1].items()),
                file=sys.stderr, flush=True)
    print(f"vLLM 0.33 time / pagedkv time on the suite's calls ({a.seeds} seeds x {a.ops} "
          f"ops, best of {a.reps} replays per operation); median of {a.rounds} rounds")
    print(f"{'layout':<16}" + "".join(f" {n[:9]:>9}" for n in names) + "   per round (best"
          " / median-of-replays)")
    for lay in runs[names[-1]][0]:
        meds = [statistics.median(run[lay]["best"] for run in runs[n]) for n in names]
        rounds = "; ".join(
            n + " " + ", ".join(f"{run[lay]['best']:.2f}/{run[lay]['median']:.2f}"
                                for run in runs[n]) for n in names
        )
        print(f"{lay:<16}" + "".join(f" {m:>8.2f}x" for m in meds) + f"   {rounds}")
    print("per operation type (vLLM time / pagedkv time, per-operation bests summed; median"
          " of rounds)")
    for n in names:
        for lay in runs[n][0]:
            methods = sorted({m for run in runs[n] for m in run[lay].get("per_op", {})})
            cells = []
            for m in methods:
                vals = [run[lay]["per_op"][m] for run in runs[n] if m in run[lay]["per_op"]]
                cells.append(f"{m}={statistics.median(vals):.2f}")
            print(f"  {n[:12]:<12} {lay:<16} " + " ".join(cells))


if __name__ == "__main__":
    main()
