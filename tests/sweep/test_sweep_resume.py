"""A sweep killed halfway (SIGKILL, for real) resumes: the re-run computes only the
points the cache lacks, and every entry the kill left is whole."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from sweep_helpers import SRC, run_cli

from pagedkv.sweep.cache import ResultCache

# 8 points of about half a second each (an agent workload), run one at a time.
GRID = {"generator": "agent", "sessions": 8, "turns": 8,
        "num_blocks": [2000, 2500, 3000, 3500, 4000, 4500, 5000, 6000]}


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("??/*.json")) if cache_dir.is_dir() else []


def test_killed_sweep_resumes_with_only_the_missing_points(tmp_path: Path) -> None:
    grid = tmp_path / "g.json"
    grid.write_text(json.dumps(GRID))
    cache_dir = tmp_path / "cache"
    argv = ["sweep", str(grid), "--jobs", "1", "--no-plot", "--out", str(tmp_path / "o"),
            "--cache-dir", str(cache_dir)]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "pagedkv", *argv], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    try:
        while len(_entries(cache_dir)) < 2:  # wait for two results, then kill
            assert proc.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.02)
        proc.kill()  # SIGKILL: no cleanup, no final write
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -9
    done = _entries(cache_dir)
    assert 2 <= len(done) < 8, len(done)
    assert not (tmp_path / "o" / "rows.csv").exists()  # killed before the end
    cache = ResultCache(cache_dir)
    for path in done:  # whole entries only (written to a temporary name, then renamed)
        assert cache.get(path.stem) is not None
    result = run_cli(*argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    counts = re.search(r"computed (\d+) points, (\d+) from the cache, 0 failed",
                       result.stdout)
    assert counts is not None, result.stdout
    assert (int(counts[1]), int(counts[2])) == (8 - len(done), len(done))
    assert f"{len(done)} from the cache, {8 - len(done)} to compute" in result.stderr
    rows = json.loads((tmp_path / "o" / "rows.json").read_text())
    assert sum(r["cached"] for r in rows) == len(done)
    assert [r["status"] for r in rows] == ["ok"] * 8
    assert len(_entries(cache_dir)) == 8
