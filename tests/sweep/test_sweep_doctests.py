"""The sweep modules' docstring examples run and show what they print."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", [
    "pagedkv.sweep.grid", "pagedkv.sweep.point", "pagedkv.sweep.cache",
    "pagedkv.sweep.backends", "pagedkv.sweep.rows", "pagedkv.sweep.pareto",
    "pagedkv.sweep.runner"])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
