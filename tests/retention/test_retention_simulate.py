"""``pagedkv simulate --retention POLICY``: the CLI path (text and JSON), a bad value
(one stderr line, exit 2, run as a user would), and the comparison's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv.cli import main
from pagedkv.errors import InvalidArgumentError
from pagedkv.sim import SimConfig, run, system_prompts
from pagedkv.sim.retention_support import POLICIES, compare_retention

# 4 system prompts of 10 blocks + questions overflow 31 blocks: LRU thrashes, pins hold.
GEN = ["--generator", "system-prompts", "--groups", "4", "--per-group", "8",
       "--shared-tokens", "160", "--message-tokens", "32", "--output-tokens", "4"]


def test_text_report_has_the_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", *GEN, "--mode", "pure-cache", "--num-blocks", "31",
                 "--retention", "pin-popular", "--no-plots", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Retention vs LRU (pure-cache, 30 blocks)" in out
    assert "pin-popular vs LRU" in out and "points" in out
    lines = {ln.split("  ")[1].strip(): ln for ln in out.splitlines() if ln.startswith("  ")}
    assert "0.0 %" in lines["LRU (vLLM)"]  # LRU never hits on this workload


def test_json_report_and_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", *GEN, "--mode", "pure-cache", "--num-blocks", "31",
                 "--retention", "pin-popular", "--no-plots", "--json"])
    assert code == 0
    s = json.loads(capsys.readouterr().out)
    r = s["retention"]
    assert r["policy"] == "pin-popular" and r["num_blocks"] == 31
    # The comparison's LRU replay is the simulator's own pure-cache run.
    assert r["lru_hit_rate"] == pytest.approx(s["hit_rate"])
    assert r["belady_hit_rate"] == pytest.approx(s["belady_hit_rate"])
    assert r["lru_hit_rate"] == 0.0 < r["policy_hit_rate"] <= r["belady_hit_rate"]
    assert r["gain_points"] == pytest.approx(100 * (r["policy_hit_rate"] - r["lru_hit_rate"]))


def test_without_the_flag_the_report_has_no_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *GEN, "--mode", "pure-cache", "--num-blocks", "31",
                 "--no-plots", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["retention"] is None


def test_bad_policy_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pagedkv", "simulate", "--retention", "keep-everything"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "--retention" in lines[0] and "pin-popular" in lines[0]


def test_api_checks_the_name_and_semantics() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown policy 'nope'"):
        SimConfig(retention="nope")
    with pytest.raises(InvalidArgumentError, match="--semantics vllm"):
        SimConfig(retention="lru", mode="pure-cache", semantics="reference")


def test_every_policy_runs_through_the_api_in_engine_mode() -> None:
    wl = system_prompts(num_groups=3, questions_per_group=4, system_tokens=96,
                        question_tokens=32, output_tokens=4)
    for name in POLICIES:
        rep = run(wl, SimConfig(num_blocks=40, retention=name, bounds=False))
        assert rep.retention is not None and rep.retention["policy"] == name
        assert rep.retention["belady_hit_rate"] is None  # bounds skipped
        if name == "lru":
            assert rep.retention["gain_points"] == 0.0


def test_tenant_quota_changes_nothing_without_tenants() -> None:
    wl = system_prompts(num_groups=4, questions_per_group=8, system_tokens=160,
                        question_tokens=32, output_tokens=4)
    c = compare_retention(wl, policy="tenant-quota", block_size=16, num_blocks=31,
                          with_belady=False)
    assert c.policy_hit_rate == c.lru_hit_rate and c.gain_points == 0.0
