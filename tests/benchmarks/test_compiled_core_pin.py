"""``benchmarks/compiled_core.py --cpu N``: the drivers it starts run on CPU ``N`` (they
inherit its affinity), and a CPU this process may not use is refused with a one-line
usage error before anything runs. Nothing here is timed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="CPU pinning needs os.sched_setaffinity (Linux)")


def test_pin_moves_the_process_and_what_it_starts_to_one_cpu() -> None:
    cpu = max(os.sched_getaffinity(0))
    code = (
        "import argparse, os, subprocess, sys\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "import compiled_core\n"
        f"compiled_core.pin(argparse.ArgumentParser(), {cpu})\n"
        "child = subprocess.run([sys.executable, '-c',\n"
        "    'import os; print(sorted(os.sched_getaffinity(0)))'],\n"
        "    capture_output=True, text=True, check=True).stdout.strip()\n"
        "print(sorted(os.sched_getaffinity(0)), child)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out == [f"[{cpu}]", f"[{cpu}]"]


def test_a_cpu_outside_the_affinity_is_a_usage_error() -> None:
    bad = max(os.sched_getaffinity(0)) + 1000
    proc = subprocess.run([sys.executable, str(BENCH / "compiled_core.py"), "--cpu",
                           str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"--cpu {bad}: not one of this process's CPUs" in proc.stderr
    assert "Traceback" not in proc.stderr
