"""Fixtures for the simulator tests: the repository's trace files (``trace_data``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from trace_data import data_file


@pytest.fixture
def data() -> Callable[[str], Path]:
    """The :func:`trace_data.data_file` lookup, as a fixture."""
    return data_file
