"""The README's quick start runs as written and prints what its comment says."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs_and_prints_what_it_claims() -> None:
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python block"
    code = blocks[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {})
    claimed = re.search(r"print\(.*\)\s+# (.*)", code)
    assert claimed is not None
    expected_ids, expected_usage = claimed.group(1).rsplit(" ", 1)
    printed = out.getvalue().strip()
    assert printed.startswith(expected_ids)
    assert printed.split()[-1].startswith(expected_usage)
