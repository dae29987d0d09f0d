"""Shared test fixtures: managers whose every call is followed by ``check_invariants()``."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings

from pagedkv import FullAttentionSpec, KVCacheManager

# No per-example deadline anywhere: CI shares its cores, and a slow example under load is
# not a failure (tests that set their own settings keep them). Under CI (``CI`` set, as
# .ci/run and most CI services do) the examples are derandomized, so a run is repeatable
# and a pass is not luck; elsewhere each run draws new examples and keeps exploring.
settings.register_profile("pagedkv", deadline=None,
                          derandomize=bool(os.environ.get("CI")), print_blob=True)
settings.load_profile("pagedkv")


def pytest_report_header() -> str | None:
    """Say when tests/torch is left out (PyTorch is not in the test extra)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return ("torch: not installed, tests/torch not collected (install PyTorch, the CPU "
                "build is enough, to run them)")
    return None


class CheckedManager:
    """Proxy over a KVCacheManager that walks all state after every method call."""

    def __init__(self, mgr: KVCacheManager) -> None:
        self.mgr = mgr

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.mgr, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            self.mgr.check_invariants()
            return out

        return call


def full_spec(block_size: int = 4) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=8, dtype_bytes=2)


@pytest.fixture
def make_mgr() -> Callable[..., Any]:
    def make(block_size: int = 4, num_blocks: int = 10, max_model_len: int = 1024,
             **options: Any) -> Any:
        mgr = KVCacheManager.from_spec(full_spec(block_size), num_blocks=num_blocks,
                                       max_model_len=max_model_len, **options)
        mgr.check_invariants()
        return CheckedManager(mgr)

    return make
