"""Figures the docs show from a command's output are that command's output today:
docs/host_tier.md's device-vs-host table is re-run here (the two commands it shows) and
must equal what they print. ``python tests/sim/test_doc_figures.py`` prints the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: The commands docs/host_tier.md shows for its table (the bundled default's first 300
#: requests, the default clock): one per write policy, each a device-only replay and two
#: host sizes.
HOST_RUNS = (
    ("on-eviction", ["--limit", "300", "--host-memory", "256GiB,1TiB"]),
    ("write-through", ["--limit", "300", "--host-memory", "256GiB,1TiB",
                       "--host-write-policy", "write-through"]),
)


def _sim_json(*args: str) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-m", "pagedkv", "simulate", *args, "--json",
                        "--no-plots", "--no-progress", "--no-bounds"], capture_output=True,
                       text=True, timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def _size(n: int) -> str:
    return f"{n >> 40} TiB" if n >= 1 << 40 else f"{n >> 30} GiB"


def host_table() -> str:
    """The table as the commands print it today (markdown)."""
    lines = ["| KV memory | host blocks | hit rate | device hits | host hits | TTFT p50 | "
             "TTFT p99 | preemptions |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for policy, args in HOST_RUNS:
        for row in _sim_json(*args)["host_sweep"]:
            size = row["host_memory_bytes"]
            if size is None and policy != "on-eviction":
                continue  # the device-only replay is the same for both policies
            name = "device only" if size is None else f"+ {_size(size)} host, {policy}"
            lines.append(
                f"| {name} | {row['host_blocks']:,} | {100 * row['hit_rate']:.1f} % | "
                f"{100 * row['device_hit_rate']:.1f} % | {100 * row['host_hit_rate']:.1f} % | "
                f"{row['ttft_p50_s']:.2f} s | {row['ttft_p99_s']:.2f} s | "
                f"{row['preemptions']:,} |")
    return "\n".join(lines)


def test_host_tier_table_is_what_its_commands_print() -> None:
    text = (DOCS / "host_tier.md").read_text(encoding="utf-8")
    assert host_table() in text
    for _, args in HOST_RUNS:  # the doc shows the commands it was made with
        assert " ".join(["pagedkv simulate", *args]) in text


if __name__ == "__main__":
    print(host_table())
