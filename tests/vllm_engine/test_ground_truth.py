"""The real CPU engine as the simulator's ground truth: ``pagedkv simulate --calibrate``
on one recorded load of vLLM's CPU engine (tiny seeded Llama on pagedkv,
``benchmarks/cpu_engine_recording.py``), then the other loads' mean TTFT and TPOT
predicted by the calibrated clock (the requests replayed as they ran) within 25 %.

Runs without vLLM: the recordings are committed (``benchmarks/data/cpu_engine/``), with
the model's ``config.json`` and the GPU spec describing this CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv.planner.gpus import load_gpu_spec
from pagedkv.sim.clock.constants import load_constants
from pagedkv.sim.clock.measured import load_measured
from pagedkv.sim.clock.replay import ReplaySetup, replay_times

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "cpu_engine"
#: The load fitted: the busiest, whose steps (prefill chunks beside up to 12 decodes) vary
#: the most, so the fit can tell HBM time from step overhead (docs/vllm.md).
FIT_ON = 12
PREDICT = (1, 4, 8)
LIMIT = 0.25


def _means(path: Path, setup: ReplaySetup | None = None, constants: object = None
           ) -> tuple[float, float]:
    data = load_measured(str(path))
    if setup is None:
        ttfts = [m.ttft_s for m in data]
        tpots = [m.tpot_s for m in data if m.tpot_s is not None]
    else:
        times = replay_times(data, setup, constants)  # type: ignore[arg-type]
        ttfts = [t for t, _ in times if t is not None]
        tpots = [p for _, p in times if p is not None]
    return sum(ttfts) / len(ttfts), sum(tpots) / len(tpots)


def calibration_table(tmp: Path) -> list[tuple[int, str, float, float, float, float]]:
    """Rows (concurrency, role, measured TTFT, predicted TTFT, measured TPOT, predicted
    TPOT), seconds; the fit runs through the CLI."""
    saved = tmp / "cpu-calibration.json"
    cmd = [sys.executable, "-m", "pagedkv", "simulate", "--model",
           str(DATA / "config.json"), "--gpu", str(DATA / "cpu-gpu-spec.json"),
           "--token-budget", "2048", "--max-running", "12",
           # in-process engine (no API server): the defaults without the request latency
           "--calibration", "offline", "--calibrate", str(DATA / f"concurrency-{FIT_ON}.json"),
           "--save-calibration", str(saved)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(proc.stdout)
    fit = json.loads(saved.read_text())
    figures = fit.get("fit", fit)
    assert figures["mean_abs_error_after"] < figures["mean_abs_error_before"], figures
    setup = ReplaySetup(model=str(DATA / "config.json"),
                        gpu=load_gpu_spec(DATA / "cpu-gpu-spec.json"),
                        token_budget=2048, max_running=12)
    constants = load_constants(str(saved))
    rows = []
    for c in (FIT_ON, *PREDICT):
        path = DATA / f"concurrency-{c}.json"
        mt, mp = _means(path)
        pt, pp = _means(path, setup, constants)
        rows.append((c, "fitted" if c == FIT_ON else "predicted", mt, pt, mp, pp))
    return rows


def test_calibrated_clock_predicts_the_other_loads(tmp_path: Path) -> None:
    rows = calibration_table(tmp_path)
    print("| concurrency | role | TTFT measured | TTFT simulated | error | TPOT measured "
          "| TPOT simulated | error |")
    for c, role, mt, pt, mp, pp in rows:
        print(f"| {c} | {role} | {mt * 1e3:.1f} ms | {pt * 1e3:.1f} ms | "
              f"{100 * (pt - mt) / mt:+.1f} % | {mp * 1e3:.2f} ms | {pp * 1e3:.2f} ms | "
              f"{100 * (pp - mp) / mp:+.1f} % |")
    for c, role, mt, pt, mp, pp in rows:
        if role == "predicted":
            assert abs(pt - mt) / mt <= LIMIT, (c, "TTFT", mt, pt)
            assert abs(pp - mp) / mp <= LIMIT, (c, "TPOT", mp, pp)


@pytest.mark.parametrize("c", [FIT_ON, *PREDICT])
def test_the_recordings_hold_every_request(c: int) -> None:
    rec = json.loads((DATA / f"concurrency-{c}.json").read_text())
    n = len(rec["ttfts"])
    assert n >= 12 and rec["max_concurrency"] == c
    for key in ("arrival_s", "first_token_s", "finish_s", "itls", "input_lens"):
        assert len(rec[key]) == n
    assert all(a < f <= e for a, f, e in zip(rec["arrival_s"], rec["first_token_s"],
                                             rec["finish_s"], strict=True))


def test_the_docs_table_is_this_test_s(tmp_path: Path) -> None:
    # docs/vllm.md shows the calibration table: every row is what the fit gives now
    doc = (DATA.parents[2] / "docs" / "vllm.md").read_text(encoding="utf-8")
    for c, role, mt, pt, mp, pp in calibration_table(tmp_path):
        row = (f"| {c} | {role} | {mt * 1e3:.1f} ms | {pt * 1e3:.1f} ms | "
               f"{100 * (pt - mt) / mt:+.1f} % | {mp * 1e3:.2f} ms | {pp * 1e3:.2f} ms | "
               f"{100 * (pp - mp) / mp:+.1f} % |")
        assert row in doc, row
