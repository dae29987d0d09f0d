"""``python -m conformance``: run the differential suite and print one line per layout.

Examples (from the repository root)::

    PYTHONPATH=src VLLM_PY -m conformance --seeds 200 --ops 300
    python -m conformance --vllm-python VLLM_PY --layouts full-16,swa --seeds 20
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from conformance.layouts import LAYOUTS, layout_by_name
from conformance.model import FIELDS


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m conformance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--vllm-python", help="interpreter with vLLM installed (re-runs the suite under it)"
    )
    ap.add_argument("--layouts", default="all", help="comma-separated layout names, or 'all'")
    ap.add_argument("--seeds", type=int, default=20, help="number of seeds per layout")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--ops", type=int, default=300, help="operations per seed")
    ap.add_argument(
        "--extras",
        default="lora,salt,mm",
        help="request extras to draw: comma-separated subset of lora,salt,mm, or 'none'",
    )
    ap.add_argument(
        "--keep-going",
        action="store_true",
        help="run every seed (default: report the first divergence per layout)",
    )
    ap.add_argument(
        "--ignore",
        default="",
        help="comma-separated compared fields to leave out (to look past a known "
        "divergence): " + ", ".join(FIELDS),
    )
    ap.add_argument(
        "--bursts",
        action="store_true",
        help="add bursts of identical requests (duplicate blocks in the index)",
    )
    ap.add_argument("--list", action="store_true", help="list the layouts and exit")
    return ap.parse_args(argv)


def _msgpack_dir() -> str | None:
    """A directory holding only this interpreter's ``msgpack`` package (pagedkv's event
    encoder needs it; a vLLM environment may lack it), or None when it is not installed."""
    import importlib.util
    import tempfile

    spec = importlib.util.find_spec("msgpack")
    if spec is None or not spec.submodule_search_locations:
        return None
    out = tempfile.mkdtemp(prefix="conformance-msgpack-")
    os.symlink(next(iter(spec.submodule_search_locations)), os.path.join(out, "msgpack"))
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        for lay in LAYOUTS:
            groups = " + ".join(
                f"{g.kind}/{g.block_size}" + (f"w{g.window_tokens}" if g.window_tokens else "")
                for g in lay.groups
            )
            unit = f", hash unit {lay.prefix_match_unit}" if lay.prefix_match_unit else ""
            print(f"{lay.name:16} {groups}  ({lay.num_blocks} blocks{unit})")
        return 0
    if args.vllm_python:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (here, os.path.join(here, "src"), _msgpack_dir(), env.get("PYTHONPATH")) if p
        )
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        i = rest.index("--vllm-python") if "--vllm-python" in rest else -1
        if i >= 0:
            del rest[i : i + 2]
        else:
            rest = [a for a in rest if not a.startswith("--vllm-python=")]
        try:
            return subprocess.call([args.vllm_python, "-m", "conformance", *rest], env=env)
        except OSError as exc:
            print(f"conformance: cannot run {args.vllm_python}: {exc}", file=sys.stderr)
            return 2
    try:
        layouts = (
            LAYOUTS
            if args.layouts == "all"
            else tuple(layout_by_name(n.strip()) for n in args.layouts.split(","))
        )
    except KeyError as exc:
        print(f"conformance: {exc.args[0]}", file=sys.stderr)
        return 2
    from conformance.vllm_side import vllm_available

    reason = vllm_available()
    if reason is not None:
        print(
            f"conformance: skipped, vLLM is not importable here ({reason}); "
            "pass --vllm-python PATH to an interpreter that has it"
        )
        print("verdict: skipped")
        return 0
    try:
        import msgpack  # noqa: F401
    except ImportError:
        print(
            "conformance: pagedkv's event encoder needs msgpack, which this interpreter "
            "lacks; run the suite from pagedkv's environment with --vllm-python PATH",
            file=sys.stderr,
        )
        return 2
    from conformance.pagedkv_side import PagedSide
    from conformance.vllm_side import VllmSide
    from conformance.workload import run_seed

    extras = frozenset(e for e in args.extras.split(",") if e and e != "none")
    if extras - {"lora", "salt", "mm"}:
        print(
            f"conformance: unknown extras {sorted(extras - {'lora', 'salt', 'mm'})}; "
            "choose from lora, salt, mm",
            file=sys.stderr,
        )
        return 2
    ignore = frozenset(f for f in args.ignore.split(",") if f)
    if ignore - set(FIELDS):
        print(
            f"conformance: unknown field(s) {sorted(ignore - set(FIELDS))}; "
            f"choose from {', '.join(FIELDS)}",
            file=sys.stderr,
        )
        return 2
    # Warm both sides up (imports, first-call caches) so the speed column is steady state.
    run_seed(layouts[0], 10**6, 50, VllmSide(layouts[0]), PagedSide(layouts[0]))
    failed = 0
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for lay in layouts:
        t0 = time.perf_counter()
        bad: list[int] = []
        first = None
        secs = {"vllm": 0.0, "pagedkv": 0.0}
        ops = 0
        for seed in seeds:
            res = run_seed(
                lay,
                seed,
                args.ops,
                VllmSide(lay),
                PagedSide(lay),
                extras=extras,
                ignore=ignore,
                bursts=args.bursts,
            )
            ops += res.num_ops
            for k, v in res.seconds.items():
                secs[k] += v
            if res.divergence is not None:
                bad.append(seed)
                first = first or res.divergence
                if not args.keep_going:
                    break
        ratio = secs["vllm"] / secs["pagedkv"] if secs["pagedkv"] else 0.0
        status = "OK" if not bad else "DIVERGED"
        num_run = len(seeds) if args.keep_going or not bad else bad[0] - args.first_seed + 1
        print(
            f"{lay.name:16} {status:8} seeds={num_run}"
            f" ops={ops} divergent_seeds={len(bad)}{'' if args.keep_going or not bad else '+'}"
            f" speed_vs_vllm={ratio:.2f}x wall={time.perf_counter() - t0:.1f}s",
            flush=True,
        )
        if bad and args.keep_going:
            shown = ",".join(map(str, bad[:40])) + (",..." if len(bad) > 40 else "")
            print(f"  divergent seeds: {shown}", flush=True)
        if first is not None:
            failed += 1
            print(
                f"  first divergence: seed={first.seed} op_index={first.op_index} op={first.op}\n"
                f"  {first.detail[:2000]}",
                flush=True,
            )
    verdict = "PASS" if not failed else f"FAIL ({failed} of {len(layouts)} layouts diverged)"
    print(f"verdict: {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
