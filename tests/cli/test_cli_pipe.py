"""``pagedkv simulate`` with its output in a pipe, as a script or ``| tee`` sees it: the
report is not wrapped (no figure split across lines), progress comes on stderr as whole
lines with an ETA, and ``--quiet`` leaves stderr to notes and errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: Progress at once and on every update, so that a short run shows it (progress.py).
_NOW = {"PAGEDKV_PROGRESS_AFTER_S": "0", "PAGEDKV_PROGRESS_EVERY_S": "0"}
_ARGS = ["simulate", "--limit", "60", "--no-plots", "--no-find-capacity"]
_LINE = re.compile(r"^replaying 60 requests: [\d,]+/60 \(\d+%\), \d+ s(, ETA \d+ s)?$")
#: A figure and its unit stay together: a line never starts with a bare unit.
_SPLIT = re.compile(r"^\s*(s|ms|%|GiB|tokens)\b")


def _simulate(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **_NOW, "COLUMNS": "60"}
    return subprocess.run([sys.executable, "-m", "pagedkv", *_ARGS, *extra],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env, stdin=subprocess.DEVNULL, check=False)


@pytest.fixture(scope="module")
def piped(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    return _simulate(tmp_path_factory.mktemp("pipe"))


def test_the_report_is_not_wrapped_in_a_pipe(
        piped: subprocess.CompletedProcess[str]) -> None:
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert not [line for line in lines if _SPLIT.match(line)]
    one_line = {key: [line for line in lines if line.lstrip().startswith(key)]
                for key in ("TTFT mean / p50 / p90 / p99", "clock:", "verdict:")}
    assert all(len(found) == 1 for found in one_line.values()), one_line
    ttft = one_line["TTFT mean / p50 / p90 / p99"][0]
    assert re.search(r"(\d[\d.]* m?s / ){3}\d[\d.]* m?s\s*$", ttft), ttft
    verdict = one_line["verdict:"][0]
    assert re.search(r"TTFT p50 [\d.]+ m?s / p99 [\d.]+ m?s", verdict), verdict
    assert verdict.rstrip().endswith("TPOT p99 100 ms."), verdict  # the whole of it
    assert max(map(len, lines)) > 60  # wider than COLUMNS: nothing wrapped at its width


def test_progress_is_whole_lines_on_stderr_with_an_eta(
        piped: subprocess.CompletedProcess[str]) -> None:
    progress = [line for line in piped.stderr.splitlines() if line.startswith("replaying")]
    assert len(progress) >= 2 and all(_LINE.match(line) for line in progress), progress
    assert progress[-1].startswith("replaying 60 requests: 60/60 (100%)")
    assert any(", ETA " in line for line in progress[:-1]), progress
    assert "\r" not in piped.stderr and "replaying" not in piped.stdout


def test_quiet_silences_progress(tmp_path: Path,
                                 piped: subprocess.CompletedProcess[str]) -> None:
    quiet = _simulate(tmp_path, "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    head = piped.stdout.splitlines()[0]
    assert quiet.stdout.splitlines()[0] == head


def test_a_reader_that_leaves_early_gets_no_error_line(tmp_path: Path) -> None:
    """``pagedkv simulate --json | head -c 10``: the JSON (about 100 kB) outgrows the pipe,
    the reader leaves; the writer stops quietly with SIGPIPE's exit status."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedkv", *_ARGS, "--quiet", "--json"], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b'{\n  "workl'
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and err == "", err


def test_a_sweep_in_a_pipe_shows_progress_lines(tmp_path: Path) -> None:
    """A sweep's progress is a whole line on stderr (not a terminal's bar)."""
    env = {**os.environ, **_NOW}
    argv = [sys.executable, "-m", "pagedkv", "sweep", "--set", "generator=system-prompts",
            "--set", "groups=2", "--set", "per-group=4", "--axis", "block-size=16,32",
            "--out", str(tmp_path / "o"), "--jobs", "1", "--no-plot"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("sweep: ")]
    assert lines[-1].startswith("sweep: 2/2 points · 0 cached · 0 failed"), proc.stderr
    assert "\r" not in proc.stderr
