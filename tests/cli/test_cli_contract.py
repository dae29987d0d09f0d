"""The contract every ``pagedkv`` subcommand keeps with a new user (``pagedkv/cli.py``):
one exit-code rule (2: the caller's mistake, 1: the run cannot be done), "did you mean"
for a misspelled option, subcommand or name, and the same size and GPU vocabulary in
every command. The subcommands are found by walking the parser, so one added tomorrow
fails here until its cases are written down."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import pytest

from pagedkv.cli import build_parser, main


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...]
            ) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    out = []
    for action in subs:
        for name, sub in action.choices.items():
            out.extend(_leaves(sub, (*path, name)))
    return out


LEAVES = dict(_leaves(build_parser(), ()))

#: Per subcommand: a caller's mistake with a number out of range (exit 2), and a run that
#: cannot be done (exit 1; None where it needs a service this test does not start).
CASES: dict[tuple[str, ...], tuple[list[str], list[str] | None]] = {
    ("simulate",): (["--tp", "0"], ["--trace", "no-such-trace.jsonl"]),
    ("plan",): (["Llama-3.1-8B", "--tp", "0"], ["Llama-3.1-70B", "--gpu-memory", "80GB"]),
    ("sweep",): (["--jobs", "0"], ["no-such-grid.json"]),
    ("bench",): (["--concurrency", "0"], ["--num-blocks", "10", "--num-requests", "20"]),
    ("index", "query"): (["--redis", "redis://127.0.0.1:1", "--hashes", "1",
                          "--block-size", "0"], None),
    ("index", "serve"): (["--redis", "redis://127.0.0.1:1", "--status-every", "0"], None),
    ("check-attention",): (["--threads", "0"], None),
    ("doctor",): (["extra-argument"], None),
}
EXTRA_MISTAKES = [
    ["simulate", "--replicas", "0"],
    ["simulate", "--gpu-memory", "-80GiB"],
    ["plan", "Llama-3.1-8B", "--gpu-memory", "-80GiB"],
    ["simulate", "--gpu-memory", "80"],
    ["plan", "Llama-3.1-8B", "--gpu-memory", "80"],
    ["simulate", "--host-memory", "-1GiB"],
    ["simulate", "--max-model-len", "0"],
    ["plan", "Llama-3.1-8B", "--gpu", "tpu"],
    ["simulate", "--gpu", "tpu"],
]


def _run(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else -1
    return code, out.getvalue(), err.getvalue()


def test_every_subcommand_has_its_cases() -> None:
    assert set(LEAVES) == set(CASES)


@pytest.mark.parametrize("path", sorted(CASES), ids=" ".join)
def test_one_exit_code_rule(path: tuple[str, ...], tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    mistake, failure = CASES[path]
    code, _, err = _run([*path, *mistake], tmp_path, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    if failure is not None:
        code, _, err = _run([*path, *failure], tmp_path, monkeypatch)
        assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("argv", EXTRA_MISTAKES, ids=" ".join)
def test_the_same_mistake_is_refused_alike_by_every_command(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = _run(argv, tmp_path, monkeypatch)
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1, err
    flag = argv[-2]
    value = argv[-1]
    assert f"argument {flag}:" in err, err
    if value.startswith("-") and value.endswith("B"):
        assert "must not be negative" in err
    if value == "80":
        assert "did you mean 80GiB?" in err
    if value == "tpu":
        assert "unknown GPU 'tpu'" in err


@pytest.mark.parametrize("path", sorted(LEAVES), ids=" ".join)
def test_a_misspelled_option_gets_did_you_mean_and_its_own_help(
        path: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = LEAVES[path]
    flag = next((f for a in parser._actions for f in a.option_strings
                 if f.startswith("--") and len(f) > 6 and f != "--help"), "--help")
    typo = flag[:3] + flag[4:]  # one letter left out
    positional = ["Llama-3.1-8B"] if path == ("plan",) else []
    code, _, err = _run([*path, *positional, typo, "1"], tmp_path, monkeypatch)
    assert code == 2 and err.count("\n") == 1, err
    assert f"did you mean {flag}" in err, err
    assert f"(see 'pagedkv {' '.join(path)} --help')" in err, err


@pytest.mark.parametrize(("argv", "suggestion"), [
    (["plna"], "did you mean 'plan'?"),
    (["simulte"], "did you mean 'simulate'?"),
    (["index", "qurey"], "did you mean 'query'?"),
    (["simulate", "--router", "cache-awre", "--replicas", "2"], "did you mean 'cache-aware'?"),
    (["simulate", "--gpu", "h10"], "did you mean 'H100-SXM'"),
    (["plan", "Qwen3-23B"], "did you mean 'Qwen3-32B'"),
])
def test_misspelled_names_get_close_matches(argv: list[str], suggestion: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = _run(argv, tmp_path, monkeypatch)
    assert code in (1, 2) and err.count("\n") == 1 and suggestion in err, err


def test_plan_and_simulate_take_the_same_gpu_names() -> None:
    """The one table: every name, family and alias parses alike in both commands."""
    from pagedkv.planner.gpus import gpu_spellings

    def gpu_type(path: tuple[str, ...]) -> object:
        return next(a.type for a in LEAVES[path]._actions if "--gpu" in a.option_strings)

    plan_gpu, sim_gpu = gpu_type(("plan",)), gpu_type(("simulate",))
    for name in gpu_spellings():
        assert plan_gpu(name) == sim_gpu(name) == sim_gpu(name.upper())  # type: ignore[operator]
