"""The ``pagedkv`` command: a thin layer over the library.

Subcommands register themselves from their own packages (``add_parser(subparsers)`` sets
``func``); this module only assembles them and turns failures into exit codes.

Exit codes and what reaches the terminal:

* ``0``: success.
* ``1``: the input or the request cannot be served: a :class:`~pagedkv.errors.PagedKVError`
  (bad file, impossible configuration), an ``OSError`` (missing or unreadable file, a
  directory where a file was expected, an unwritable output) or a file that is not text.
  One line on stderr: ``pagedkv COMMAND: error: ...``.
* ``2``: a usage error (unknown option, bad value). One line on stderr, naming the
  command's ``--help``.
* ``130``: interrupted (Ctrl-C).

Anything else is a bug in pagedkv: the traceback is kept and a last line asks to report it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from pagedkv import __version__
from pagedkv.arg_types import harden_parser
from pagedkv.core import native
from pagedkv.errors import PagedKVError

__all__ = ["OneLineParser", "main"]

# Modules that provide ``add_parser(subparsers)``; the order is the help order.
_SUBCOMMAND_MODULES = (
    "pagedkv.sim.cli",
    "pagedkv.sweep.cli",
    "pagedkv.planner.cli",
    "pagedkv.bench",
    "pagedkv.cluster.cli",
    "pagedkv.torch.cli",
    "pagedkv.doctor",
)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one stderr line and exit code 2.

    Sub-parsers created from it are of the same class, so every subcommand behaves alike.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="pagedkv",
        description="Paged KV-cache manager with automatic prefix caching: plan capacity, "
        "replay workloads, measure speed.",
    )
    parser.add_argument("--version", action="version",
                        version=f"pagedkv {__version__} ({native.CORE} core)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_parser(sub)
    harden_parser(parser)
    return parser


def _describe(exc: BaseException) -> str:
    """One line for an expected failure: the message without the class noise."""
    if isinstance(exc, UnicodeDecodeError):
        return (f"the input is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                f"{exc.start}); pass a text file")
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for commands that echo it
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code: int = func(args)
    except (PagedKVError, OSError, UnicodeDecodeError) as exc:
        print(f"pagedkv {args.command}: error: {_describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception:
        import traceback

        traceback.print_exc()
        print(f"pagedkv {args.command}: internal error; please report it with the command "
              "line above", file=sys.stderr)
        return 70
    return code


if __name__ == "__main__":
    sys.exit(main())
