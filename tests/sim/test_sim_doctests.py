"""The simulator's docstring examples run (the library entry point, one replica stepped
from outside, the kv-cache-tester worked case)."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["pagedkv.sim.api", "pagedkv.sim.engine"])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
