"""The ``pagedkv`` command: a thin layer over the library.

Subcommands register themselves from their own packages (``add_parser(subparsers)`` sets
``func``); this module only assembles them. Exit codes: 0 success, 1 invalid input (bad
file, impossible configuration), 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from pagedkv import __version__
from pagedkv.errors import PagedKVError

__all__ = ["main"]

# Modules that provide ``add_parser(subparsers)``; the order is the help order.
_SUBCOMMAND_MODULES = (
    "pagedkv.sim.cli",
    "pagedkv.planner.cli",
    "pagedkv.bench",
    "pagedkv.cluster.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagedkv",
        description="Paged KV-cache manager with automatic prefix caching: plan capacity, "
        "replay workloads, measure speed.",
    )
    parser.add_argument("--version", action="version", version=f"pagedkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code: int = func(args)
    except PagedKVError as exc:
        print(f"pagedkv {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
