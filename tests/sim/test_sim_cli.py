"""``pagedkv simulate`` end to end (small runs): the default workload, JSON, plots, the
capacity sweep, generators, and errors reported as one line with exit code 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedkv.cli import main


def test_default_workload_runs_and_writes_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plots = tmp_path / "report"
    code = main(["simulate", "--limit", "150", "--no-progress", "--plot-dir", str(plots)])
    out = capsys.readouterr().out
    assert code == 0
    assert "bundled default workload" in out
    assert "hit rate (all requests)" in out and "Belady optimum" in out
    assert "TTFT p50" in out and "planner: Llama-3.1-8B" in out
    assert f"plots written to {plots.resolve()}" in out
    assert (plots / "hit_rate_usage.png").stat().st_size > 1000


def test_json_pure_cache_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([
        "simulate", "--limit", "200", "--mode", "pure-cache", "--block-size", "512",
        "--num-blocks", "101", "--capacity-sweep", "1e4,1e5,unlimited", "--json",
        "--no-progress", "--plot-dir", str(tmp_path),
    ])
    assert code == 0
    s = json.loads(capsys.readouterr().out)
    assert s["mode"] == "pure-cache" and s["capacity_tokens"] == 100 * 512
    assert s["hit_rate"] <= s["belady_hit_rate"] <= s["infinite_cache_hit_rate"]
    rows = s["capacity_sweep"]
    assert [r["capacity_tokens"] for r in rows] == [10_000, 100_000, None]
    assert rows[-1]["lru"] == rows[-1]["infinite"] and rows[-1]["evicted_blocks"] == 0
    assert all(r["lru"] <= r["belady"] <= r["infinite"] for r in rows)
    assert rows[0]["num_blocks"] == 10_000 // 512 + 1
    assert sorted(Path(p).name for p in s["plots"]) == [
        "hit_rate_usage.png", "hit_rate_vs_capacity.png"]


def test_generator_reports_ideal(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--generator", "system-prompts", "--groups", "2",
                 "--per-group", "4", "--num-blocks", "2000", "--no-plots", "--json"])
    assert code == 0
    s = json.loads(capsys.readouterr().out)
    assert s["hit_rate"] == pytest.approx(s["ideal_hit_rate"])
    assert s["ideal_hit_rate"] == pytest.approx(2 * 3 * 1536 / (2 * 4 * 1736))


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--groups", "3"], 2, "--groups is a generator parameter"),
        (["--generator", "multi-turn", "--groups", "3"], 2, "does not apply"),
        (["--block-size", "48"], 2, "divisor of 512"),
        (["--num-blocks", "10", "--model", "Llama-3.1-8B"], 2, "either --num-blocks"),
        (["--trace", "/nonexistent.jsonl"], 1, "cannot open"),
    ],
)
def test_errors_exit_by_the_rule(argv: list[str], code: int, message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """2: options that contradict or a value out of range; 1: the run cannot be done."""
    assert main(["simulate", "--no-plots", *argv]) == code
    err = capsys.readouterr().err
    assert err.startswith("pagedkv simulate: error:") and message in err


def test_bad_trace_line_and_skip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 5, "input_length": 40, "output_length": 2}\n'
    )
    assert main(["simulate", "--trace", str(trace), "--num-blocks", "50", "--no-plots"]) == 1
    assert f"{trace}:2: key 'hash_ids': missing" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(trace), "--num-blocks", "50", "--no-plots",
                 "--skip-bad-lines", "--trace-block-size", "64"]) == 0
    assert "1 bad lines skipped" in capsys.readouterr().out


def test_engine_bounds_count_replies_and_skip_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Multi-turn in engine mode: replies are cached while decoding, so the ceiling the
    # report shows includes them and equals the engine-mode analytic ideal.
    assert main(["simulate", "--generator", "multi-turn", "--sessions", "3", "--turns", "3",
                 "--num-blocks", "3000", "--no-plots", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["hit_rate"] == pytest.approx(s["ideal_hit_rate"])
    assert s["infinite_cache_hit_rate"] == pytest.approx(s["ideal_hit_rate"])
    # A request longer than the whole cache is rejected, and left out of the bounds too:
    # the other two share everything but the last token, so both rates are 1 hit in 2.
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 65, "output_length": 1, "hash_ids": [1]}\n'
        '{"timestamp": 9, "input_length": 4000, "output_length": 1, "hash_ids": [1, 2, 3, 4, '
        '5, 6, 7, 8]}\n'
        '{"timestamp": 9, "input_length": 65, "output_length": 1, "hash_ids": [1]}\n'
    )
    assert main(["simulate", "--trace", str(trace), "--num-blocks", "20", "--no-plots",
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["rejected_requests"] == 1
    assert s["hit_rate"] == s["infinite_cache_hit_rate"] == s["belady_hit_rate"] == 64 / 130


def test_huge_num_blocks_is_capped_and_said(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--limit", "20", "--num-blocks", str(10**12), "--no-plots",
                 "--json", "--jobs", "1"])
    assert code == 0
    s = json.loads(capsys.readouterr().out)
    note = s["settings"]["capacity"]["note"]
    assert "capped to" in note and s["num_blocks"] < 10**6


@pytest.mark.parametrize("semantics", ["reference", "vllm"])
def test_pure_cache_smaller_than_a_prompt(semantics: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # Regression: prompts of 25 blocks of 512 in a 19-block cache, seen again, made
    # --semantics reference fail with an AssertionError (an internal error).
    trace = tmp_path / "long.jsonl"
    trace.write_text("".join(
        json.dumps({"timestamp": t, "input_length": 12800, "output_length": 1,
                    "hash_ids": list(range(25))}) + "\n" for t in (0, 1000, 2000)))
    code = main(["simulate", "--trace", str(trace), "--mode", "pure-cache", "--semantics",
                 semantics, "--block-size", "512", "--num-blocks", "20", "--no-plots",
                 "--no-progress", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hit_tokens"] == 2 * 19 * 512, report
