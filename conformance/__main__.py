"""``python -m conformance``: run the differential suite and print one line per layout.

Examples (from the repository root)::

    PYTHONPATH=src VLLM_PY -m conformance --seeds 200 --ops 300
    python -m conformance --vllm-python VLLM_PY --layouts full-16,swa --seeds 20
    python -m conformance --vllm-python VLLM_PY --record tests/conformance/transcripts \\
        --seeds 10 --ops 300
    python -m conformance --replay tests/conformance/transcripts     # no vLLM needed

Without vLLM and without ``--replay`` it exits 1 with one line saying why.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

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
    ap.add_argument(
        "--record",
        metavar="DIR",
        help="run vLLM alone and write its transcripts (one .jsonl.gz per layout) to DIR",
    )
    ap.add_argument(
        "--replay",
        metavar="DIR",
        help="compare pagedkv with the vLLM transcripts in DIR (no vLLM needed; seeds, "
        "operations and extras come from the transcripts)",
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
        _print_layouts()
        return 0
    if args.vllm_python:
        return _rerun_under(args.vllm_python, argv)
    try:
        layouts = (
            LAYOUTS
            if args.layouts == "all"
            else tuple(layout_by_name(n.strip()) for n in args.layouts.split(","))
        )
    except KeyError as exc:
        return _fail(str(exc.args[0]), 2)
    extras = frozenset(e for e in args.extras.split(",") if e and e != "none")
    if extras - {"lora", "salt", "mm"}:
        return _fail(
            f"unknown extras {sorted(extras - {'lora', 'salt', 'mm'})}; choose from lora, salt, mm",
            2,
        )
    ignore = frozenset(f for f in args.ignore.split(",") if f)
    if ignore - set(FIELDS):
        return _fail(
            f"unknown field(s) {sorted(ignore - set(FIELDS))}; choose from {', '.join(FIELDS)}", 2
        )
    if args.record and args.replay:
        return _fail("--record and --replay exclude each other", 2)
    try:
        import msgpack  # noqa: F401
    except ImportError:
        return _fail(
            "pagedkv's event encoder needs msgpack, which this interpreter lacks; run the "
            "suite from pagedkv's environment ('.[dev]'), with --vllm-python PATH for vLLM",
            2,
        )
    if args.replay:
        from conformance.runs import replay_layouts

        return replay_layouts(args.replay, None if args.layouts == "all" else layouts, ignore)
    from conformance.vllm_side import vllm_available

    reason = vllm_available()
    if reason is not None:
        return _fail(
            f"vLLM is not importable here ({reason}); pass --vllm-python PATH to an "
            "interpreter that has it, or --replay tests/conformance/transcripts to compare "
            "with vLLM 0.33's recorded transcripts",
            1,
        )
    import vllm

    from conformance.layouts import layouts_for, release_of
    from conformance.runs import RunOptions, live_layouts, record_layouts

    runnable = layouts_for(release_of(vllm.__version__), layouts)
    if args.layouts != "all" and runnable != layouts:
        skipped = sorted(x.name for x in layouts if x not in runnable)
        return _fail(f"vLLM {vllm.__version__} cannot run layouts {skipped} (hash lookahead "
                     "is vLLM 0.33's); leave them out", 2)
    layouts = runnable

    opts = RunOptions(
        seeds=range(args.first_seed, args.first_seed + args.seeds),
        num_ops=args.ops,
        extras=extras,
        ignore=ignore,
        bursts=args.bursts,
        keep_going=args.keep_going,
    )
    if args.record:
        return record_layouts(args.record, layouts, opts)
    return live_layouts(layouts, opts)


def _fail(message: str, code: int) -> int:
    print(f"conformance: {message}", file=sys.stderr)
    return code


def _print_layouts() -> None:
    for lay in LAYOUTS:
        groups = " + ".join(
            f"{g.kind}/{g.block_size}" + (f"w{g.window_tokens}" if g.window_tokens else "")
            for g in lay.groups
        )
        unit = f", hash unit {lay.prefix_match_unit}" if lay.prefix_match_unit else ""
        print(f"{lay.name:16} {groups}  ({lay.num_blocks} blocks{unit})")


def _rerun_under(python: str, argv: list[str] | None) -> int:
    """Run the suite again under ``python`` with this checkout (and msgpack) on its path."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.path.join(here, "src"), _msgpack_dir(), env.get("PYTHONPATH")) if p
    )
    rest = list(argv if argv is not None else sys.argv[1:])
    i = rest.index("--vllm-python") if "--vllm-python" in rest else -1
    if i >= 0:
        del rest[i : i + 2]
    else:
        rest = [a for a in rest if not a.startswith("--vllm-python=")]
    try:
        return subprocess.call([python, "-m", "conformance", *rest], env=env)
    except OSError as exc:
        return _fail(f"cannot run {python}: {exc}", 2)


if __name__ == "__main__":
    sys.exit(main())
