"""The retention component spec: :class:`RetentionConfig`, the value
``CacheConfig(retention=...)`` takes (its fields and checks are
:class:`~pagedkv.retention.policy.RetentionSettings`).

>>> RetentionConfig(pin_budget_fraction=0.5).preempt_pins
False
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.core.components import ManagerBuild, ManagerComponent
from pagedkv.retention.control import RetentionControl
from pagedkv.retention.eviction import RetentionPolicy
from pagedkv.retention.policy import RetentionSettings

__all__ = ["RetentionConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionConfig(RetentionSettings):
    """Turns retention control on for a manager (``CacheConfig(retention=...)``; fields:
    :class:`~pagedkv.retention.policy.RetentionSettings`)."""

    def attach(self, build: ManagerBuild) -> ManagerComponent:
        """Attach retention to a manager being built (a component spec, see
        :mod:`pagedkv.core.components`): the pool's eviction policy becomes a
        :class:`~pagedkv.retention.eviction.RetentionPolicy`, the façade's ``retention``
        a :class:`~pagedkv.retention.control.RetentionControl`."""
        policy = RetentionPolicy(self, build.config.num_blocks)
        build.policy = policy
        return RetentionControl(policy)
