"""Features reached as components: typed ``component(Kind)`` / ``find_component(Kind)``,
and the config's shortcut fields' attributes (``None`` when absent)."""

from __future__ import annotations

import pytest

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
from pagedkv.core.components import ManagerBuild, ManagerComponent
from pagedkv.core.config import SHORTCUTS
from pagedkv.errors import ConfigError
from pagedkv.retention import RetentionConfig, RetentionControl

SPEC = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)


class Counter(ManagerComponent):
    """A component of a feature the core has never heard of."""


class CounterSpec:
    def attach(self, build: ManagerBuild) -> ManagerComponent:
        return Counter("counter")


def make(**fields: object) -> KVCacheManager:
    return KVCacheManager(CacheConfig.with_fields(groups=(SPEC,), num_blocks=8,
                                                  max_model_len=64, **fields))


def test_typed_access_and_shortcuts() -> None:
    mgr = make(retention=RetentionConfig(), components=(CounterSpec(),))
    control = mgr.component(RetentionControl)
    assert mgr.find_component(RetentionControl) is control is mgr.retention
    counter = mgr.component(Counter)
    assert mgr.__dict__["counter"] is counter  # any component: the attribute its name gives
    assert mgr.observe is None and mgr.host is None  # shortcut fields not set


def test_absent_component() -> None:
    mgr = make()
    assert mgr.find_component(RetentionControl) is None
    with pytest.raises(ConfigError, match="no RetentionControl component"):
        mgr.component(RetentionControl)
    for name in SHORTCUTS.values():
        assert getattr(mgr, name) is None
    assert mgr.config.component_specs() == []
