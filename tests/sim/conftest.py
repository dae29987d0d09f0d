"""Shared data for the simulator tests: ``../shared`` beside the repository root. A missing
file fails the test (never skips it): CI must provide the data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def shared_file(relative: str) -> Path:
    """``../shared/<relative>`` (relative to the repository root); fails when missing."""
    path = SHARED / relative
    assert path.exists(), f"test data missing: ../shared/{relative} (see data/traces/SOURCE.md)"
    return path


@pytest.fixture
def shared() -> Callable[[str], Path]:
    """The :func:`shared_file` lookup, as a fixture."""
    return shared_file
