"""The examples in the planner modules' docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "pagedkv.planner.api",
    "pagedkv.planner.backends",
    "pagedkv.planner.bundled",
    "pagedkv.planner.model_spec",
    "pagedkv.planner.plan",
    "pagedkv.planner.plan_types",
    "pagedkv.planner.readers",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
