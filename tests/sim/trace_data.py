"""Trace files for the simulator tests: ``data/traces/`` in the repository (gzip-compressed
copies of public traces, provenance in ``data/traces/SOURCE.md``). A missing file fails the
test (never skips it)."""

from __future__ import annotations

import gzip
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"


def data_file(relative: str) -> Path:
    """``data/<relative>`` in the repository; fails when missing."""
    path = DATA / relative
    assert path.exists(), f"test data missing: data/{relative} (see data/traces/SOURCE.md)"
    return path


def read_text(path: Path) -> str:
    """The text of ``path``, gunzipped when it ends in ``.gz``."""
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    return path.read_text(encoding="utf-8")
