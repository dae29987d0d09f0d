"""The docstring examples of the cluster modules run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["pagedkv.cluster.index", "pagedkv.cluster.hit_rules", "pagedkv.cluster.router"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
