"""Every bundled model at its defaults, with ``plan`` and ``simulate --limit 20``: it runs,
or its one line says what to change (``--tp N``), and the change named works. Requests
longer than the model's context are rejected and counted by reason."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from pagedkv.cli import main
from pagedkv.planner.bundled import bundled_model_names

MODELS = bundled_model_names()
_SIM = ["--limit", "20", "--no-plots", "--no-find-capacity", "--quiet"]


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _runs_or_names_the_fix(argv: list[str]) -> None:
    """Exit 0, or one line naming the change (``use --tp N``, ``use --block-size N``),
    which then runs: at most two changes."""
    for _ in range(3):
        code, _, err = _run(argv)
        if code == 0:
            return
        assert code in (1, 2) and err.count("\n") == 1, err
        fix = re.search(r"use (--tp|--block-size) (\d+)", err)
        assert fix is not None, err
        assert fix[1] == "--block-size" or "a larger GPU" in err, err
        argv = [*argv, fix[1], fix[2]]
    raise AssertionError(f"still failing after the named changes: {argv}")


@pytest.mark.parametrize("model", MODELS)
def test_plan_at_the_defaults(model: str) -> None:
    _runs_or_names_the_fix(["plan", model, "--brief"])


@pytest.mark.parametrize("model", MODELS)
def test_simulate_at_the_defaults(model: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _runs_or_names_the_fix(["simulate", "--model", model, *_SIM])


def test_a_context_that_does_not_fit_is_capped_and_said() -> None:
    code, out, err = _run(["plan", "qwen3-32b", "--brief"])
    assert code == 0 and "max_model_len: 36,752, capped" in out and "--max-model-len N" in out
    code, _, err = _run(["simulate", "--model", "qwen3-32b", *_SIM])
    assert code == 0 and err.startswith("note: max_model_len capped to 36,752"), err


def test_prompts_longer_than_the_context_are_rejected_by_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedkv.sim.loaders import load_trace
    from pagedkv.sim.workloads import bundled_trace_path

    monkeypatch.chdir(tmp_path)
    limit = 8192
    wl = load_trace(bundled_trace_path(), limit=20)
    longer = sum(r.num_prompt_tokens + max(1, r.num_output_tokens) > limit
                 for r in wl.requests)
    assert longer > 0
    argv = ["simulate", "--max-model-len", str(limit), *_SIM]  # the first 20 requests
    code, out, err = _run([*argv, "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["rejected_requests"] == longer
    assert report["rejected_by_reason"] == {"over_max_model_len": longer, "over_cache": 0}
    assert report["settings"]["max_model_len"] == limit
    code, out, _ = _run(argv)
    assert re.search(rf"rejected +{longer} +\({longer} longer than max_model_len 8,192\)",
                     out), out
