"""Retention control: priorities, pinned prefixes with leases, expiry, per-tenant quotas.

Off by default: a manager without ``CacheConfig(retention=...)`` keeps vLLM's LRU exactly.
See ``docs/retention.md``.
"""

from pagedkv.retention.config import RetentionConfig
from pagedkv.retention.control import RetentionControl
from pagedkv.retention.eviction import RetentionPolicy
from pagedkv.retention.pins import PinLease
from pagedkv.retention.policy import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    RequestRetention,
    TokenRangeRetention,
)
from pagedkv.retention.priority_queue import PriorityFreeQueue

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "PinLease",
    "PriorityFreeQueue",
    "RequestRetention",
    "RetentionConfig",
    "RetentionControl",
    "RetentionPolicy",
    "TokenRangeRetention",
]
