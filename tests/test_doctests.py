"""The examples in docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "pagedkv.core.cbor",
    "pagedkv.core.config",
    "pagedkv.core.coordinator",
    "pagedkv.core.coordinator_base",
    "pagedkv.core.hash_extras",
    "pagedkv.core.hashing",
    "pagedkv.core.manager",
    "pagedkv._moved",
    "pagedkv.core.held_blocks",
    "pagedkv.core.block_info",
    "pagedkv.vllm.extras",
    "pagedkv.core.components",
    "pagedkv.core.factory",
    "pagedkv.core.managers.base",
    "pagedkv.core.managers.chunked_local",
    "pagedkv.core.managers.cross_attention",
    "pagedkv.core.managers.full",
    "pagedkv.core.managers.mamba",
    "pagedkv.core.managers.sliding_window",
    "pagedkv.core.metrics",
    "pagedkv.core.partial_hits",
    "pagedkv.core.request",
    "pagedkv.core.specs",
    "pagedkv.planner",
    "pagedkv.planner.units",
    "pagedkv.events.config",
    "pagedkv.events.settings",
    "pagedkv.events.snapshot",
    "pagedkv.events.wire",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
