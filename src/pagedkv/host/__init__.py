"""A host-memory tier: device blocks live on in CPU memory, and a hit there comes back as
a load plan (see ``docs/host_tier.md``).

>>> from pagedkv.host import HostTierConfig, make_manager
"""

from pagedkv.host.config import HostTierSettings, device_block_bytes, host_blocks_for_bytes
from pagedkv.host.manager import (
    HostTierComponent,
    HostTierConfig,
    HostTieredKVCacheManager,
    make_manager,
)
from pagedkv.host.plans import (
    AFTER_FORWARD,
    BEFORE_FORWARD,
    GroupLoad,
    GroupStore,
    HostHit,
    HostKey,
    LoadPlan,
    LookupState,
    StorePlan,
    TieredHit,
)
from pagedkv.host.policy import AdmitAfterHits, AdmitAll, StoreOnEviction, WriteThrough
from pagedkv.host.pool import HostBlockPool
from pagedkv.host.tier import HostTierStats

__all__ = [
    "AFTER_FORWARD",
    "BEFORE_FORWARD",
    "AdmitAfterHits",
    "AdmitAll",
    "GroupLoad",
    "GroupStore",
    "HostBlockPool",
    "HostHit",
    "HostKey",
    "HostTierComponent",
    "HostTierConfig",
    "HostTierSettings",
    "HostTierStats",
    "HostTieredKVCacheManager",
    "LoadPlan",
    "LookupState",
    "StoreOnEviction",
    "StorePlan",
    "TieredHit",
    "WriteThrough",
    "device_block_bytes",
    "host_blocks_for_bytes",
    "make_manager",
]
