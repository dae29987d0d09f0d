"""``pagedkv simulate --host-memory``: the report's host section and host-memory table, JSON
figures that add up, and every bad host flag as one stderr line with exit 2 (usage) or 1
— run in a subprocess, as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

GEN = ["--generator", "multi-turn", "--sessions", "8", "--turns", "4", "--num-blocks", "120",
       "--no-plots", "--no-progress", "--no-bounds"]


def _simulate(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pagedkv", "simulate", *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_text_report_has_the_host_section_and_sweep(tmp_path: Path) -> None:
    proc = _simulate(tmp_path, *GEN, "--host-memory", "64MiB,1GiB",
                     "--host-bandwidth-gbps", "25")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for text in ("Host tier", "hit tokens: device / host", "64.00 MiB = 32 blocks of 2.00 MiB",
                 "25 GB/s per direction", "Host memory: effect on hits and TTFT",
                 "device only", "1.00 GiB"):
        assert text in out, text


def test_a_hybrid_model_replays_with_a_host_tier(tmp_path: Path) -> None:
    """Gemma 3 (full attention + sliding window groups): each group by its own host rule."""
    proc = _simulate(tmp_path, "--no-progress", "--no-plots", "--no-bounds", "--limit", "5",
                     "--host-memory", "1GiB", "--model", "Gemma-3-27B-it")
    assert proc.returncode == 0, proc.stderr
    assert "Host tier" in proc.stdout and "hit tokens: device / host" in proc.stdout


def test_retention_host_tier_and_miss_attribution_together(tmp_path: Path) -> None:
    """The three features on one manager: each one's section is in the report."""
    proc = _simulate(tmp_path, *GEN, "--host-memory", "64MiB", "--retention", "pin-popular",
                     "--explain-misses")
    assert proc.returncode == 0, proc.stderr
    for text in ("Host tier", "Retention vs LRU", "Missed prompt tokens by reason"):
        assert text in proc.stdout, text


def test_json_per_tier_figures_add_up(tmp_path: Path) -> None:
    proc = _simulate(tmp_path, *GEN, "--json", "--host-memory", "1GiB,64MiB",
                     "--host-write-policy", "write-through")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    tier = d["host_tier"]
    assert tier["device_hit_tokens"] + tier["host_hit_tokens"] == d["hit_tokens"]
    assert tier["host_hit_tokens"] > 0 and tier["num_blocks"] == 512
    assert tier["bandwidth_gbps"] == 25.0  # the default
    rows = d["host_sweep"]
    assert [r["host_memory_bytes"] for r in rows] == [None, 1 << 30, 64 << 20]
    assert rows[1]["hit_rate"] == pytest.approx(d["hit_rate"])
    assert rows[1]["host_hit_rate"] > rows[0]["host_hit_rate"] == 0.0
    for r in rows:
        assert r["device_hit_rate"] + r["host_hit_rate"] == pytest.approx(r["hit_rate"])


def test_no_host_baseline_skips_the_table(tmp_path: Path) -> None:
    proc = _simulate(tmp_path, *GEN, "--json", "--host-memory", "1GiB", "--no-host-baseline")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["host_tier"]["num_blocks"] == 512 and "host_sweep" not in d


def test_without_host_flags_the_report_has_no_host_figures(tmp_path: Path) -> None:
    proc = _simulate(tmp_path, *GEN, "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert "host_tier" not in d and "host_sweep" not in d


CASES: list[tuple[str, list[str], int, str]] = [
    ("not a size", ["--host-memory", "lots"], 2, "not a size"),
    ("one part bad", ["--host-memory", "256GiB,many"], 2, "not a size"),
    ("zero", ["--host-memory", "0"], 2, "above 0"),
    ("negative", ["--host-memory=-1GiB"], 2, "negative"),
    ("unknown unit", ["--host-memory", "3parsecs"], 2, "not a size"),
    ("zero bandwidth", ["--host-memory", "1GiB", "--host-bandwidth-gbps", "0"], 2,
     "in (0, 1e+06]"),
    ("nan bandwidth", ["--host-memory", "1GiB", "--host-bandwidth-gbps", "nan"], 2,
     "finite number"),
    ("text bandwidth", ["--host-memory", "1GiB", "--host-bandwidth-gbps", "fast"], 2,
     "--host-bandwidth-gbps"),
    ("bad policy", ["--host-memory", "1GiB", "--host-write-policy", "never"], 2,
     "invalid choice"),
    ("smaller than a block", ["--host-memory", "1KiB", "--num-blocks", "100"], 2,
     "holds no block"),
    ("bandwidth alone", ["--host-bandwidth-gbps", "25"], 2, "needs --host-memory"),
    ("policy alone", ["--host-write-policy", "write-through"], 2, "needs --host-memory"),
    ("baseline alone", ["--no-host-baseline"], 2, "needs --host-memory"),
    ("pure-cache", ["--host-memory", "1GiB", "--mode", "pure-cache"], 2, "--mode engine"),
    ("replicas", ["--host-memory", "1GiB,2GiB", "--replicas", "2"], 2, "one size"),
    ("find capacity", ["--host-memory", "1GiB", "--find-capacity"], 2, "drop --host-memory"),
]


@pytest.mark.parametrize(("name", "argv", "code", "text"), CASES, ids=[c[0] for c in CASES])
def test_bad_host_flags(tmp_path: Path, name: str, argv: list[str], code: int,
                        text: str) -> None:
    proc = _simulate(tmp_path, "--no-progress", "--no-plots", "--no-bounds", "--limit", "5",
                     *argv)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == code, (name, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(err) == 1, err
    assert err[0].startswith("pagedkv") and "error:" in err[0] and text in err[0], err
