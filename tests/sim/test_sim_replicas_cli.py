"""``pagedkv simulate --replicas N --router ...`` runs the cluster replica comparison."""

from __future__ import annotations

import json
import subprocess
import sys

GEN = ["--generator", "system-prompts", "--groups", "2", "--per-group", "4",
       "--num-blocks", "500", "--no-plots", "--no-progress"]


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pagedkv", "simulate", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_replicas_compare_json_has_every_policy() -> None:
    p = _sim(*GEN, "--replicas", "2", "--router", "compare", "--json")
    assert p.returncode == 0, p.stderr
    text = json.dumps(json.loads(p.stdout))
    for policy in ("round-robin", "least-loaded", "cache-aware"):
        assert policy in text


def test_replicas_bad_values_are_one_line() -> None:
    p = _sim(*GEN, "--replicas", "0")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    p = _sim(*GEN, "--router", "cache-aware")
    assert p.returncode == 1 and "--replicas" in p.stderr and "Traceback" not in p.stderr
