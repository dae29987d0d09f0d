"""Figures the docs show from a command's output are that command's output today."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _sim_json(*args: str) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-m", "pagedkv", "simulate", *args, "--json",
                        "--no-plots", "--no-progress", "--no-bounds"], capture_output=True,
                       text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def test_host_tier_device_only_row_is_the_linear_clock_run() -> None:
    text = (DOCS / "host_tier.md").read_text(encoding="utf-8")
    row = re.search(r"^\| device only \| 0 \| ([\d.]+) % \| [\d.]+ % \| [\d.]+ % \| "
                    r"([\d,]+) ms \| ([\d,]+) ms \| ([\d,]+) \|$", text, re.M)
    assert row is not None, "the device-only row of docs/host_tier.md"
    run = _sim_json("--step-model", "linear")
    ttft = run["latency_s"]["ttft_s"]
    assert row.group(1) == f"{100 * run['hit_rate']:.1f}"
    assert row.group(2) == f"{1e3 * ttft['p50']:,.0f}"
    assert row.group(3) == f"{1e3 * ttft['p99']:,.0f}"
    assert row.group(4) == f"{run['preemptions']:,}"


def test_host_tier_default_clock_figures_are_the_default_run() -> None:
    # the sentence under the table: the same device-only run on the default clock
    text = " ".join((DOCS / "host_tier.md").read_text(encoding="utf-8").split())
    run = _sim_json("--no-find-capacity")
    shown = (f"the default clock gives the device-only run TTFT p50 "
             f"{run['latency_s']['ttft_s']['p50']:.0f} s and {run['preemptions']:,} "
             "preemptions")
    assert shown in text
