"""The ``pagedkv`` command's failure contract: one stderr line, a documented exit code, no
traceback, no hang (``pagedkv/cli.py``). Subcommand-specific bad inputs live beside their
subcommand's tests; these are the shared wrapper and ``pagedkv bench``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from pagedkv import bench, cli

BAD_INVOCATIONS = [
    # (argv, exit code, words the one line must contain)
    (["bench", "--concurrency", "0"], 2, ["--concurrency", "at least 1"]),
    (["bench", "--num-requests", "0"], 2, ["--num-requests", "at least 1"]),
    (["bench", "--num-requests", "abc"], 2, ["whole number", "'abc'"]),
    (["bench", "--num-blocks", "10", "--num-requests", "20"], 1,
     ["no request fits", "raise --num-blocks"]),
    (["bench", "--num-blocks", str(10**12)], 2, ["num_blocks", "between 2 and"]),
    (["bench", "--workload", "nope"], 2, ["invalid choice", "--help"]),
    (["bench", "--bogus"], 2, ["unrecognized arguments", "--help"]),
    (["no-such-command"], 2, ["invalid choice"]),
]


@pytest.mark.parametrize(("argv", "code", "words"), BAD_INVOCATIONS,
                         ids=[" ".join(a) for a, _, _ in BAD_INVOCATIONS])
def test_bad_invocation_is_one_line_and_an_exit_code(
        argv: list[str], code: int, words: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pagedkv", *argv], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_bench_reports_requests_that_did_not_fit() -> None:
    # 100 blocks of 16 tokens hold prompts up to 1,584 tokens: most requests of the
    # shared-prefix workload fit, the longest do not and are counted instead of timed.
    report = bench.run_bench(bench.BenchConfig(num_requests=40, num_blocks=90))
    assert 0 < report["rejected_requests"] < 40


def test_bench_help_has_help_text_for_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bench_parser = subparsers.choices["bench"]
    undocumented = [a.option_strings for a in bench_parser._actions if not a.help]
    assert undocumented == []
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "--seed" in out and "``" not in out  # no RST markup dumped into --help


def test_unexpected_exception_keeps_traceback_and_asks_for_a_report(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(args: object) -> int:
        raise RuntimeError("planted bug")

    monkeypatch.setattr(bench, "_run", broken)
    assert cli.main(["bench"]) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "planted bug" in err and "please report" in err


def test_file_errors_name_the_file(capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def reads_missing(args: object) -> int:
        with open("no/such/file.jsonl", encoding="utf-8"):
            return 0

    monkeypatch.setattr(bench, "_run", reads_missing)
    assert cli.main(["bench"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "pagedkv bench: error: no/such/file.jsonl: No such file or directory"


def test_undecodable_input_is_one_line(capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def decodes_binary(args: object) -> int:
        b"\x00\xff\xfe".decode("utf-8")
        return 0

    monkeypatch.setattr(bench, "_run", decodes_binary)
    assert cli.main(["bench"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not UTF-8 text" in err[0]


@pytest.mark.parametrize("pure", ["1", "0"])
def test_version_names_the_core_in_use(pure: str) -> None:
    """``pagedkv --version`` says which core runs: PAGEDKV_PURE=1 forces the pure one."""
    from importlib.util import find_spec

    env = {**os.environ, "PAGEDKV_PURE": pure}
    proc = subprocess.run([sys.executable, "-m", "pagedkv", "--version"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode == 0, proc.stderr
    built = find_spec("pagedkv.core._ccore") is not None  # even when this process is pure
    expected = "compiled" if pure == "0" and built else "pure"
    assert proc.stdout.strip().endswith(f"({expected} core)"), proc.stdout
