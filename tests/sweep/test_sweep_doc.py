"""docs/sweep.md's worked example is what its command prints today: the grid file it
shows is the repository's, and the sweep's output (stderr's first line, then stdout) is
the code block under it, line for line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sweep.md"
GRID = ROOT / "docs" / "examples" / "sweep_grid.yaml"


def _block_after(text: str, marker: str) -> str:
    """The fenced code block that starts with ``marker``."""
    start = text.index("```\n" + marker) + 4
    return text[start:text.index("\n```", start)]


def test_the_worked_example_is_the_commands_output(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    assert "pagedkv sweep docs/examples/sweep_grid.yaml --out sweep-example" in text
    grid = "\n".join(x for x in GRID.read_text(encoding="utf-8").splitlines()
                     if not x.startswith("#"))
    assert f"```yaml\n{grid}\n```" in text
    p = subprocess.run([sys.executable, "-m", "pagedkv", "sweep", str(GRID), "--out",
                        "sweep-example", "--jobs", "2"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    printed = p.stderr.splitlines()[0] + "\n" + p.stdout.rstrip("\n")
    assert _block_after(text, "sweep: ") == printed
