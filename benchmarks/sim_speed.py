"""Time and peak memory of ``pagedkv simulate`` on a trace, this checkout against another
(same run, alternating, median of N), measured with ``/usr/bin/time -v``.

    python benchmarks/sim_speed.py --other-src /path/to/old/checkout/src \\
        --trace data/traces/conversation_trace.jsonl.gz --block-size 16 --runs 3

Prints, per checkout, wall seconds, CPU seconds (user + system, worker processes
included) and the largest process's peak RSS, each run and the median. Extra arguments
after ``--`` go to ``pagedkv simulate`` (default: ``--num-blocks 25650`` so both sides do
the same work whatever their default GPU size).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE_SRC = Path(__file__).resolve().parents[1] / "src"


def one_run(src: Path, args: list[str]) -> tuple[float, float, float]:
    """(wall s, cpu s, peak RSS MB) of one ``pagedkv simulate`` run with ``src`` first on
    the path."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        cmd = ["/usr/bin/time", "-v", "-o", tf.name, sys.executable, "-c",
               f"import sys; sys.path.insert(0, {str(src)!r}); from pagedkv.cli import main; "
               f"sys.exit(main({['simulate', *args]!r}))"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        text = Path(tf.name).read_text()

    def field(name: str) -> str:
        m = re.search(rf"{re.escape(name)}: (.+)", text)
        assert m, name
        return m.group(1).strip()

    parts = [float(x) for x in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    wall = parts[-1] + 60 * parts[-2] + (3600 * parts[-3] if len(parts) > 2 else 0)
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    rss = float(field("Maximum resident set size (kbytes)")) / 1024
    return wall, cpu, rss


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other-src", required=True, help="the other checkout's src directory")
    p.add_argument("--trace", required=True)
    p.add_argument("--block-size", default="16")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("extra", nargs="*", help="more simulate arguments (after --)")
    a = p.parse_args()
    args = ["--trace", a.trace, "--block-size", a.block_size, "--no-plots", "--no-progress",
            *(a.extra or ["--num-blocks", "25650"])]
    sides = {"this": HERE_SRC, "other": Path(a.other_src).resolve()}
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in sides}
    for i in range(a.runs):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for name in order:
            results[name].append(one_run(sides[name], args))
            w, c, r = results[name][-1]
            print(f"run {i + 1} {name:5s}: wall {w:6.1f} s  cpu {c:6.1f} s  peak RSS {r:6.0f} MB",
                  flush=True)
    for name, rows in results.items():
        med = [statistics.median(col) for col in zip(*rows, strict=True)]
        print(f"median {name:5s}: wall {med[0]:6.1f} s  cpu {med[1]:6.1f} s  peak RSS "
              f"{med[2]:6.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
