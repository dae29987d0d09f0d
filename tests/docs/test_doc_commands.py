"""Every shell command README.md and docs/*.md show runs here, or is listed with its reason.

Commands run from a scratch directory that links the checkout's folders (data, docs,
benchmarks, ...), so their outputs (plots, sweep directories, calibrations) stay out of the
checkout. A long replay runs with a smaller ``--limit`` and its doc's comment says so
(``docs test: --limit 300``). The runs take about 10 minutes on 2 cores, so they run with
``PAGEDKV_DOC_COMMANDS=1`` (``.ci/run`` sets it in a step beside the suite); the checks
that every command is planned, and the rest of this file, run in the suite.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

import pytest
from doc_commands import PLAN, ROOT, Run, Skip, commands

LINKED = ("data", "docs", "benchmarks", "tests", "src", "conformance", "pyproject.toml")


def test_every_documented_command_is_planned() -> None:
    shown = [c for _, c in commands()]
    assert len(shown) > 40
    assert [c for c in shown if c not in PLAN] == [], "a new doc command: add it to PLAN"
    assert [c for c in PLAN if c not in shown] == [], "a command left the docs: drop it"


def test_a_shortened_command_says_so_in_its_doc() -> None:
    for doc, command in commands():
        plan = PLAN[command]
        if not isinstance(plan, Run) or not (plan.add or plan.replace):
            continue
        change = " ".join(plan.add) if plan.add else plan.replace[0][1]
        if "tests/PATH" in command:  # a placeholder filled in, not a shorter run
            continue
        text = (ROOT / doc).read_text()
        assert re.search(r"docs test: [^\n]*" + re.escape(change), text), (doc, command)


def _argv(command: str, plan: Run) -> tuple[list[str], dict[str, str]]:
    for old, new in plan.replace:
        command = command.replace(f" {old}", f" {new}", 1) if f" {old}" in command else command
    words = shlex.split(command) + list(plan.add)
    env = dict(os.environ)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words[0] == "pagedkv":
        words = [sys.executable, "-m", "pagedkv", *words[1:]]
    elif words[0] in ("python", "python3"):
        words = [sys.executable, *words[1:]]
    return words, env


RUNNABLE = sorted({c for c, p in PLAN.items() if isinstance(p, Run)})


@pytest.mark.parametrize("command", RUNNABLE)
def test_documented_command_runs(command: str, tmp_path: pathlib.Path) -> None:
    plan = PLAN[command]
    assert isinstance(plan, Run)
    if os.environ.get("PAGEDKV_DOC_COMMANDS") != "1":
        pytest.skip("the docs' commands (about 10 minutes on 2 cores) run with "
                    "PAGEDKV_DOC_COMMANDS=1: .ci/run runs them beside the suite")
    if plan.needs and importlib.util.find_spec(plan.needs) is None:
        pytest.skip(f"needs {plan.needs}")
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    argv, env = _argv(command, plan)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    took_s = time.perf_counter() - start
    print(f"\n{command} -> exit {proc.returncode} in {took_s:.1f} s")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_skips_have_reasons() -> None:
    for command, plan in PLAN.items():
        if isinstance(plan, Skip):
            assert len(plan.reason) > 10, command


#: What names an item of a project tracker ("<noun> 19", "the <noun> asks", "#19"): such
#: references, and the names of local work branches, mean nothing to a reader of the repo.
_TICKET_NOUNS = ("issue", "ticket")


def _work_branches() -> list[str]:
    """Local branch names other than the main line (empty outside a git checkout)."""
    out = subprocess.run(["git", "for-each-ref", "--format=%(refname:short)", "refs/heads"],
                         cwd=ROOT, capture_output=True, text=True).stdout.split()
    return [b for b in out if b not in ("main", "master") and len(b) > 2]


def _tracker_pattern(branches: list[str]) -> re.Pattern[str]:
    nouns = "|".join(_TICKET_NOUNS)
    parts = [rf"\b(?:{nouns})s? #?\d+", rf"\bthe (?:{nouns}) asks",
             r"(?<![\w/&'\"])#\d{1,4}\b", r"\bwork[- ]branch"]
    parts += [rf"\bbranch {re.escape(b)}\b" for b in branches]
    parts += [rf"\b{re.escape(b)}\b" for b in branches if any(c.isdigit() for c in b)]
    return re.compile("|".join(parts), re.I)


_TRACKER = _tracker_pattern(_work_branches())
_BINARY = (".gz", ".png", ".so", ".pyd", ".parquet", ".whl")


def test_no_tracker_words_in_the_repo() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    hits = []
    for name in files:
        path = ROOT / name
        if name.endswith(_BINARY) or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in _TRACKER.finditer(line):
                hits.append(f"{name}:{number}: {m.group(0)!r}")
    hits = [h for h in hits if not h.startswith("tests/docs/test_doc_commands.py")]
    assert hits == []


def test_the_tracker_pattern_can_fail() -> None:
    pattern, n = _tracker_pattern(["feature7"]), 19
    for noun in _TICKET_NOUNS:
        for planted in (f"as {noun} {n} said", f"the {noun} asks for", f"see #{n}",
                        "from branch feature7", "as feature7 did"):
            assert pattern.search(planted), planted
    for fine in ("vllm-0#1", "docs/sweep.md#the-grid", "# 1 comment", "issues a warning"):
        assert not pattern.search(fine), fine


def test_docs_list_the_bundled_models() -> None:
    """docs/planner.md names every bundled model (the list cannot go stale)."""
    bundled = sorted(p.stem for p in (ROOT / "src/pagedkv/data/model_configs").glob("*.json"))
    assert bundled
    text = (ROOT / "docs/planner.md").read_text()
    missing = [name for name in bundled if f"`{name}`" not in text]
    assert missing == []


def test_no_example_output_is_left_in_the_checkout() -> None:
    untracked = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                               cwd=ROOT, capture_output=True, text=True).stdout
    outputs = [line for line in untracked.splitlines()
               if re.search(r"sweep-example|pagedkv-report|\.png$", line)
               and line.startswith("??")]
    assert outputs == []



def test_a_contradictory_sweep_point_is_named(tmp_path: pathlib.Path) -> None:
    """docs/sweep.md: a contradiction stops the sweep naming the point (its table's row)."""
    grid = tmp_path / "g.json"
    grid.write_text('{"limit": 20, "model": "llama-3.1-8b", "tp": [1], "num_blocks": [100]}')
    proc = subprocess.run([sys.executable, "-m", "pagedkv", "sweep", str(grid), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    row = re.search(r"\| contradictory point \| `([^`]+)` \|",
                    (ROOT / "docs/sweep.md").read_text())
    assert row is not None and proc.returncode == 2
    assert proc.stderr.strip() == f"pagedkv sweep: error: {row.group(1)}"
