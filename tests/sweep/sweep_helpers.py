"""Small grids whose points run in well under a second each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"

#: A synthetic workload every test grid shares (8 requests, two system prompts).
SMALL_WORKLOAD: dict[str, Any] = {"generator": "system-prompts", "groups": 2, "per_group": 4}


def small_grid(**axes: list[Any]) -> dict[str, Any]:
    """The small workload with ``axes`` (default: num_blocks x replicas, 4 points)."""
    return {**SMALL_WORKLOAD, **(axes or {"num_blocks": [300, 2000], "replicas": [1, 2]})}


def run_cli(*argv: str, cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m pagedkv ARGV`` in a child process (this checkout's sources first)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "pagedkv", *argv], capture_output=True,
                          text=True, timeout=timeout_s, cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL)
