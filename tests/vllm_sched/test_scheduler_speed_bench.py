"""``benchmarks/vllm_scheduler_speed.py`` at a tiny size: every cell kind (sync and async,
full attention and the hybrid) runs, both sides schedule the same tokens and blocks
(exit code 0), and ``--profile`` prints the KV-cache manager's share per side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed")

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_runs_every_cell_kind_with_equal_schedules() -> None:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "vllm_scheduler_speed.py"),
         "--running", "6", "--rounds", "1", "--decode-tokens", "5", "--shared-tokens", "32",
         "--window", "32", "--profile", "--profile-top", "3"],
        capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 6 |")]
    assert len(rows) == 4 and all(row.endswith("| equal |") for row in rows), out.stdout
    cells = {tuple(row.split(" | ")[1:3]) for row in rows}
    assert cells == {(m, lay) for m in ("sync", "async") for lay in ("full", "hybrid")}
    assert "stock:" in out.stdout and "pagedkv:" in out.stdout
    assert "KV-cache manager" in out.stdout and "load before:" in out.stdout
