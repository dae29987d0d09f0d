"""Sweeps on local processes: rows equal to ``simulate``'s figures, the same with one or
two workers, re-runs served by the cache, a failing point recorded in its row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from sweep_helpers import SMALL_WORKLOAD, run_cli, small_grid

from pagedkv.cli import main
from pagedkv.sweep import LocalBackend, SweepSpec, grid_from_mapping, run_sweep
from pagedkv.sweep.rows import comparable


def _sweep(tmp_path: Path, data: dict[str, object], jobs: int, out: str = "out"):
    grid = grid_from_mapping(data, where="grid")
    return run_sweep(SweepSpec(grid=grid, out_dir=tmp_path / out, plot=False,
                               backend=LocalBackend(jobs=jobs)), log=lambda _s: None)


def test_one_and_two_workers_give_identical_rows(tmp_path: Path) -> None:
    serial = _sweep(tmp_path, small_grid(), jobs=1, out="a")
    parallel = _sweep(tmp_path, small_grid(), jobs=2, out="b")
    assert [r["status"] for r in serial.rows] == ["ok"] * 4
    assert [comparable(r) for r in serial.rows] == [comparable(r) for r in parallel.rows]
    assert [r["gpus"] for r in serial.rows] == [1, 2, 1, 2]  # replicas x tp
    assert serial.rows[0]["usd_per_hour"] == pytest.approx(2.99)  # default GPU H100-SXM
    with open(tmp_path / "a" / "rows.csv", newline="") as fh:
        got = list(csv.DictReader(fh))
    assert [int(r["point"]) for r in got] == [0, 1, 2, 3]
    assert float(got[1]["hit_rate"]) == serial.rows[1]["hit_rate"]  # repr: exact
    assert json.loads((tmp_path / "a" / "rows.json").read_text()) == serial.rows


def test_a_point_is_what_simulate_reports(tmp_path: Path) -> None:
    res = _sweep(tmp_path, {**SMALL_WORKLOAD, "num_blocks": [300, 2000]}, jobs=1)
    proc = run_cli("simulate", "--generator", "system-prompts", "--groups", "2",
                   "--per-group", "4", "--num-blocks", "300", "--json", "--no-plots",
                   "--no-progress", "--no-bounds", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sim = json.loads(proc.stdout)
    row = res.rows[0]
    assert row["hit_rate"] == sim["hit_rate"]
    assert row["ttft_p99_s"] == sim["latency_s"]["ttft_s"]["p99"]
    assert row["tpot_p50_s"] == sim["latency_s"]["tpot_s"]["p50"]
    assert row["preemptions"] == sim["preemptions"]


def test_a_one_replica_point_is_what_simulate_reports(tmp_path: Path) -> None:
    # The replicas axis goes through the same engine and clock: its 1-replica row is
    # simulate's, figure for figure (the bundled default's first 200 requests, the
    # planner's capacity, the roofline clock).
    grid = {"limit": 200, "replicas": [1, 2], "router": ["round-robin"]}
    res = _sweep(tmp_path, grid, jobs=1)
    assert [r["status"] for r in res.rows] == ["ok", "ok"]
    proc = run_cli("simulate", "--limit", "200", "--json", "--no-plots", "--no-progress",
                   "--no-bounds", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sim = json.loads(proc.stdout)
    row = res.rows[0]
    lat = sim["latency_s"]
    expected = {
        "requests": sim["requests"], "rejected": sim["rejected_requests"],
        "num_blocks": sim["num_blocks"], "hit_rate": sim["hit_rate"],
        "preemptions": sim["preemptions"], "output_tokens_per_s": sim["output_tokens_per_s"],
        "kv_usage_mean": sim["usage_mean"], "kv_usage_max": sim["usage_max"],
        **{f"{n}_{q}_s": lat[f"{n}_s"][q] for n in ("ttft", "tpot", "e2e")
           for q in ("mean", "p50", "p99")},
    }
    assert {k: row[k] for k in expected} == expected
    assert sim["preemptions"] > 0 and res.rows[1]["gpus"] == 2


def test_a_rerun_computes_only_new_points(tmp_path: Path) -> None:
    first = _sweep(tmp_path, small_grid(num_blocks=[300, 2000]), jobs=1)
    assert (first.computed, first.cached) == (2, 0)
    again = _sweep(tmp_path, small_grid(num_blocks=[300, 2000]), jobs=1)
    assert (again.computed, again.cached) == (0, 2)
    assert [r["cached"] for r in again.rows] == [True, True]
    assert [comparable(r) for r in again.rows] == [comparable(r) for r in first.rows]
    more = _sweep(tmp_path, small_grid(num_blocks=[300, 2000, 5000]), jobs=1)
    assert (more.computed, more.cached) == (1, 2)


def test_a_crashing_point_gets_an_error_row_and_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A 70B model leaves no KV memory on one 40 GB GPU: that point fails when it runs.
    argv = ["sweep", "--set", "generator=system-prompts", "--set", "groups=2",
            "--set", "per-group=4", "--set", "gpu=A100-40GB",
            "--axis", "model=Llama-3.1-8B,Llama-3.1-70B", "--out", str(tmp_path / "o"),
            "--jobs", "2", "--no-plot"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    rows = json.loads((tmp_path / "o" / "rows.json").read_text())
    assert [r["status"] for r in rows] == ["ok", "error"]
    assert rows[1]["error"].startswith("ConfigError: Llama-3.1-70B: the weights")
    assert rows[0]["hit_rate"] is not None and rows[1]["hit_rate"] is None
    assert "1 point(s) failed" in err
    assert "computed 2 points, 0 from the cache, 1 failed" in out
    assert main(argv) == 1  # the failure is not cached: tried again, the success is
    out, _ = capsys.readouterr()
    assert "computed 1 points, 1 from the cache, 1 failed" in out


def test_cli_tables_and_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "g.json"
    grid.write_text(json.dumps(small_grid()))
    prices = tmp_path / "p.json"
    prices.write_text(json.dumps({"h100": 2.0}))
    code = main(["sweep", str(grid), "--out", str(tmp_path / "o"), "--jobs", "1",
                 "--prices", str(prices), "--slo-ttft-p99-s", "1", "--slo-tpot-p99-ms",
                 "100"])
    out, _ = capsys.readouterr()
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["point", "num_blocks", "replicas"]
    assert "Pareto front (cost vs TTFT p99):" in out
    assert lines[-1].startswith("cheapest point meeting the SLO (TTFT p99 <= 1 s and "
                                "TPOT p99 <= 100 ms): point 0, num_blocks=300 replicas=1: "
                                "$2.00/h on 1 H100-SXM")
    assert (tmp_path / "o" / "pareto.png").stat().st_size > 10_000
