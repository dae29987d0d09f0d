"""Every option of every subcommand, found by walking the argparse parsers, attacked with
every hostile value of :data:`catalogue.CLI_VALUES` — no case is written by hand, so an
option added tomorrow is attacked the day it is added.

Three levels:

* **parse** (all options x all values): the option's type either refuses the text (argparse
  turns that into one usage line, exit 2) or returns a usable value: finite, within
  64 bits, valid Unicode (:func:`catalogue.insane`);
* **run** (every value option x the numeric edge values its type accepts: ``-1``, ``0``,
  ``1e300``, 2**63 - 1, and a missing file): the command runs in-process and ends with exit
  0, or exit 1/2 and one line on stderr, no traceback, within bounded time and memory;
* **exit path** (a few subprocesses): the real interpreter exits 2 with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from catalogue import CLI_VALUES, insane

from pagedkv.arg_types import is_guarded
from pagedkv.cli import build_parser, main

Option = tuple[tuple[str, ...], argparse.Action]


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[Option]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub not in [c for n, c in action.choices.items() if n < name and c is sub]:
                    yield from _walk(sub, (*path, name))
        elif action.nargs != 0 and not isinstance(action, argparse._HelpAction):
            yield path, action


OPTIONS: list[Option] = list(_walk(build_parser(), ()))
IDS = [f"{' '.join(p)} {a.option_strings[0] if a.option_strings else a.dest}"
       for p, a in OPTIONS]


def test_every_subcommand_has_options() -> None:
    commands = {p for p, _ in OPTIONS}
    assert {("simulate",), ("plan",), ("sweep",), ("bench",)} <= commands
    assert len(OPTIONS) >= 100


@pytest.mark.parametrize("option", OPTIONS, ids=IDS)
def test_option_is_guarded(option: Option) -> None:
    """Every value-taking option passes the shared checks (arg_types.harden_parser)."""
    assert is_guarded(option[1]), f"{IDS[OPTIONS.index(option)]} is not guarded"


def _parse(action: argparse.Action, text: str) -> tuple[bool, object]:
    """(accepted, value) the way argparse converts ``text`` for ``action``."""
    try:
        value = action.type(text) if action.type is not None else text  # type: ignore[misc]
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False, None
    if action.choices is not None and value not in action.choices:
        return False, None
    return True, value


@pytest.mark.parametrize("option", OPTIONS, ids=IDS)
def test_parse_level(option: Option) -> None:
    """Each hostile text is refused by the type, or parsed to a usable value."""
    _, action = option
    bad = []
    for text in CLI_VALUES:
        accepted, value = _parse(action, text)
        why = insane(value) if accepted else None
        if why is not None:
            bad.append(f"{text!r:.20} -> {why}")
    assert not bad, bad


#: A cheap valid invocation of each command, the attacked option appended to it.
BASE: dict[tuple[str, ...], list[str]] = {
    # --no-find-capacity: an attacked --limit replays the whole bundled trace, and a
    # saturated bundled run would otherwise also search deployments (a minute), which
    # tests nothing about the option
    ("simulate",): ["simulate", "--limit", "2", "--no-find-capacity", "--no-plots"],
    ("plan",): ["plan", "Llama-3.1-8B", "--kv-cache-memory", "20GiB"],
    ("bench",): ["bench", "--help"],
    ("sweep",): ["sweep", "--help"],
    ("index", "query"): ["index", "query", "--help"],
    ("index", "serve"): ["index", "serve", "--help"],
    ("check-attention",): ["check-attention", "--help"],
}
#: Values whose run is attacked when the type accepts them.
RUN_VALUES = ("-1", "0", "1e300", str(2**63 - 1), "missing-file.json")
#: The memory a single hostile run may add to the process, and the time it may take.
MAX_RSS_GROWTH_KIB = 1_500_000
MAX_RUN_S = 60.0


def _run_cases() -> list[tuple[str, list[str]]]:
    cases = []
    for path, action in OPTIONS:
        base = BASE.get(path)
        if base is None or "--help" in base or not action.option_strings:
            continue
        flag = action.option_strings[0]
        for text in RUN_VALUES:
            if _parse(action, text)[0] and (action.nargs in (None, 1, "?")):
                cases.append((f"{' '.join(path)} {flag}={text:.12}", [*base, flag, text]))
    return cases


RUN_CASES = _run_cases()


@pytest.mark.parametrize("argv", [c[1] for c in RUN_CASES], ids=[c[0] for c in RUN_CASES])
def test_run_level(argv: list[str], tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An accepted edge value either works or fails as one line with exit 1 or 2."""
    monkeypatch.chdir(tmp_path)
    err, out = io.StringIO(), io.StringIO()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    elapsed = time.monotonic() - start
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    text = err.getvalue()
    assert code in (0, 1, 2), (code, text[-2000:])
    assert "Traceback" not in text, text[-2000:]
    if code != 0:
        assert text.count("\n") == 1, text
    assert elapsed < MAX_RUN_S and grown < MAX_RSS_GROWTH_KIB, (elapsed, grown)


def test_the_pairs_counted() -> None:
    """The counts docs/reliability.md reports (kept in step by this test)."""
    pairs = len(OPTIONS) * len(CLI_VALUES)
    print(f"cli: {len(OPTIONS)} options x {len(CLI_VALUES)} values = {pairs} parse pairs; "
          f"{len(RUN_CASES)} runs")
    assert pairs >= 2000 and len(RUN_CASES) >= 50


@pytest.mark.parametrize("argv", [
    ["simulate", "--model", "\udcff"],
    ["simulate", "--kv-events-topic", "\udcff"],
    ["simulate", "--limit", "nan"],
    ["plan", "Llama-3.1-8B", "--tp", "True"],
])
def test_the_real_exit_path(argv: list[str], tmp_path: Path) -> None:
    """In a real interpreter, argv bytes that are not UTF-8 included: exit 2, one line."""
    raw = [a.encode("utf-8", "surrogateescape") for a in argv]
    proc = subprocess.run([sys.executable.encode(), b"-m", b"pagedkv", *raw],
                          capture_output=True, timeout=120, cwd=tmp_path)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
