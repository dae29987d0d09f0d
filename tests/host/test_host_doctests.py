"""The examples in the host tier's docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["pagedkv.host.pool", "pagedkv.host.policy", "pagedkv.host.config",
           "pagedkv.host.manager", "pagedkv.host.rules"]


@pytest.mark.parametrize("name", MODULES)
def test_host_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
