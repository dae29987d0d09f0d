"""The ``pagedkv`` command: a thin layer over the library.

Subcommands register themselves from their own packages (``add_parser(subparsers)`` sets
``func``); this module only assembles them and turns failures into exit codes.

Exit codes, one rule for every subcommand (README, "Exit codes"), and what reaches the
terminal:

* ``0``: success.
* ``1``: the run cannot be done or failed: a :class:`~pagedkv.errors.PagedKVError` other
  than a caller's mistake (bad file, a model that does not fit, impossible
  configuration), an ``OSError`` (missing or unreadable file, a directory where a file
  was expected, an unwritable output) or a file that is not text. One line on stderr:
  ``pagedkv COMMAND: error: ...``.
* ``2``: a caller's mistake: unknown option or subcommand (with "did you mean"), a
  malformed or out-of-range value (``--tp 0``, ``--replicas 0``, ``-80GiB``), an unknown
  name, options that contradict
  (:class:`~pagedkv.errors.InvalidArgumentError`). One line on stderr, naming the
  ``--help`` of the subcommand that was typed.
* ``130``: interrupted (Ctrl-C); ``141``: the reader of stdout left (``| head``), silently.

Anything else is a bug in pagedkv: the traceback is kept and a last line asks to report it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from pagedkv import __version__
from pagedkv.arg_types import harden_parser
from pagedkv.cli_args import exit_code
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


#: Values that start with ``-`` and a digit (``-80GiB``, ``-1``) are values, so that a
#: negative size or count is refused by its type ("must not be negative"), not with
#: argparse's "expected one argument".
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")
_INVALID_CHOICE = re.compile(r"^argument (?P<arg>[^:]+): invalid choice: '(?P<word>.*)' "
                             r"\(choose from (?P<choices>.*)\)$")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one stderr line and exit code 2, with
    "did you mean" for a misspelled option, subcommand or choice.

    Sub-parsers created from it are of the same class, so every subcommand behaves alike;
    a subcommand refuses its own unknown options (naming its own ``--help``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_VALUE
        self.is_subcommand = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self.is_subcommand and args is not None and not self._subparsers:
            unknown = [a for a in self._typed_flags(args) if not self._known(a)]
            if unknown:  # before "required" errors: the typo is the news
                self.error(f"unrecognized arguments: {unknown[0]}"
                           + self._option_hint(unknown))
        parsed, extras = super().parse_known_args(args, namespace)
        if self.is_subcommand and extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}"
                       + self._option_hint(extras))
        return parsed, extras

    @staticmethod
    def _typed_flags(args: list[str]) -> list[str]:
        """The ``--flag`` words of ``args`` (up to a ``--``), without ``=value``."""
        words = list(args)
        words = words[:words.index("--")] if "--" in words else words
        return [w.split("=", 1)[0] for w in words if w.startswith("--") and len(w) > 2]

    def _known(self, flag: str) -> bool:
        """Whether ``flag`` is an option of this parser or a prefix argparse accepts."""
        flags = [f for a in self._actions for f in a.option_strings]
        return flag in flags or (self.allow_abbrev and any(f.startswith(flag) for f in flags))

    def _option_hint(self, extras: list[str]) -> str:
        flags = [f for a in self._actions for f in a.option_strings]
        for word in extras:
            if word.startswith("--"):
                close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=2,
                                                  cutoff=0.75)
                if close:
                    return f"; did you mean {' or '.join(close)}?"
        return ""

    def error(self, message: str) -> NoReturn:
        match = _INVALID_CHOICE.match(message)
        if match is not None:
            choices = re.findall(r"'([^']*)'", match["choices"])
            close = difflib.get_close_matches(match["word"], choices, n=2, cutoff=0.5)
            if close:
                message += f"; did you mean {' or '.join(map(repr, close))}?"
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _mark_subcommands(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if isinstance(sub, OneLineParser):
                    sub.is_subcommand = True
                _mark_subcommands(sub)


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
    _mark_subcommands(parser)
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


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail."""
    import os

    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
    except (OSError, ValueError):  # not a real file (a test's buffer)
        pass


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
    except BrokenPipeError:  # the reader left (``| head``): nothing to say, as SIGPIPE
        _silence_stdout()
        return 141
    except (PagedKVError, OSError, UnicodeDecodeError) as exc:
        print(f"pagedkv {args.command}: error: {_describe(exc)}", file=sys.stderr)
        return exit_code(exc)
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
