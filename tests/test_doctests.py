"""The examples in docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "pagedkv.cbor",
    "pagedkv.config",
    "pagedkv.coordinator",
    "pagedkv.coordinator_base",
    "pagedkv.hashing",
    "pagedkv.manager",
    "pagedkv.manager_queries",
    "pagedkv.managers.base",
    "pagedkv.managers.chunked_local",
    "pagedkv.managers.cross_attention",
    "pagedkv.managers.full",
    "pagedkv.managers.mamba",
    "pagedkv.managers.sliding_window",
    "pagedkv.metrics",
    "pagedkv.request",
    "pagedkv.specs",
    "pagedkv.planner",
    "pagedkv.planner.units",
    "pagedkv.events.config",
    "pagedkv.events.snapshot",
    "pagedkv.events.wire",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
