"""Values the host tier hands to the engine: lookup states, hits across tiers, and the
load and store *plans* the engine executes (copies between device and host blocks).

Every plan names block ids only; the engine owns the bytes. A plan is confirmed with
``complete_load(plan, success)`` / ``complete_store(plan, success)`` on the manager.

Worked case (block size 4, one group): a 13-token prompt whose first 4 tokens are cached
on the device (block 7) and whose next 8 tokens live in host blocks 3 and 5. The lookup
answers ``TieredHit(device=<hit of 4 tokens>, host=HostHit(groups=((3, 5),), ...))`` (12
tokens in all); ``allocate_slots(req, 1, new_computed_blocks=hit)`` gives the request
device blocks ``[7, 1, 2, 4]`` and queues the load plan
``LoadPlan(groups=(GroupLoad(group=0, host_block_ids=(3, 5), device_block_ids=(1, 2),
first_block=1, num_tokens=8),), ...)``: copy host 3 -> device 1, host 5 -> device 2.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pagedkv.core.coordinator import ComputedBlocks

__all__ = [
    "AFTER_FORWARD",
    "BEFORE_FORWARD",
    "GroupLoad",
    "GroupStore",
    "HostHit",
    "HostKey",
    "LoadPlan",
    "LookupState",
    "StorePlan",
    "TieredHit",
]

#: A host-tier key: (block hash, KV-cache group index), as vLLM's ``OffloadKey``.
HostKey = tuple[bytes, int]

#: Store timing: the device block is about to be reused (an eviction store); copy it out
#: before the step's forward pass writes into it.
BEFORE_FORWARD = "before_forward"
#: Store timing: the device block is filled by this step (a write-through store); copy it
#: after the step's forward pass.
AFTER_FORWARD = "after_forward"


class LookupState(enum.Enum):
    """One key in the host tier (vLLM's ``LookupResult``): absent, readable, or being
    stored (present but not readable until its store completes)."""

    MISS = "miss"
    HIT = "hit"
    HIT_PENDING = "hit_pending"


@dataclass(frozen=True, slots=True, kw_only=True)
class HostHit:
    """The host part of a hit: it continues the device hit, which ends at table position
    ``first_block``, by ``num_tokens`` tokens. Per group, the host block ids the
    continuation needs, for the table positions just before the hit's end (full attention:
    every position from ``first_block``; a sliding window: those inside the window; a
    Mamba group: the state at the hit's end; see :mod:`pagedkv.host.rules`).
    ``keys[g][i]`` is the key of ``host_block_ids[g][i]``. ``num_pending_blocks``: blocks
    the hit could grow by once keys still being stored are ready
    (``LookupState.HIT_PENDING``); a caller may wait for them instead of recomputing."""

    first_block: int
    num_tokens: int
    host_block_ids: tuple[tuple[int, ...], ...]
    keys: tuple[tuple[HostKey, ...], ...]
    num_pending_blocks: int = 0

    @property
    def num_blocks(self) -> int:
        """Host blocks to load, all groups together."""
        return sum(len(ids) for ids in self.host_block_ids)


@dataclass(frozen=True, slots=True, kw_only=True)
class TieredHit:
    """A lookup across tiers: the device prefix hit (a plain :class:`ComputedBlocks`, as
    ``get_computed_blocks`` returns it) followed by the host continuation."""

    device: ComputedBlocks
    host: HostHit

    @property
    def num_device_tokens(self) -> int:
        return self.device.num_computed_tokens

    @property
    def num_host_tokens(self) -> int:
        return self.host.num_tokens

    @property
    def num_computed_tokens(self) -> int:
        """Tokens the request need not compute: device hit + host hit."""
        return self.device.num_computed_tokens + self.host.num_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLoad:
    """Copies for one group: ``host_block_ids[i]`` -> ``device_block_ids[i]``; the device
    blocks sit at table positions ``first_block ..``; the load brings the request
    ``num_tokens`` tokens (every group the same). A Mamba group's one state lands in the
    request's live block (the engine starts its next step from it)."""

    group: int
    host_block_ids: tuple[int, ...]
    device_block_ids: tuple[int, ...]
    first_block: int
    num_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPlan:
    """Host -> device copies for one request (all groups). Its host blocks are protected
    from eviction, and its device blocks stay unregistered, until
    ``complete_load(plan, success)``. ``num_device_tokens`` were hit on the device,
    ``num_host_tokens`` come with this load; after it the request has
    ``num_computed_tokens`` = their sum. ``resumable``: after a failed load the request
    still holds every block its first ``num_device_tokens`` tokens need, so it can
    recompute from there; False (a sliding-window, chunked-local or Mamba group dropped
    the device hit's blocks the host part made unneeded): free the request and admit it
    again."""

    plan_id: int
    request_id: str
    groups: tuple[GroupLoad, ...]
    num_device_tokens: int
    num_host_tokens: int
    resumable: bool = True

    @property
    def num_computed_tokens(self) -> int:
        return self.num_device_tokens + self.num_host_tokens

    @property
    def num_blocks(self) -> int:
        """Blocks copied, all groups together."""
        return sum(len(g.host_block_ids) for g in self.groups)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupStore:
    """Copies for one group: ``device_block_ids[i]`` -> ``host_block_ids[i]``, the block
    hashed ``block_hashes[i]``."""

    group: int
    device_block_ids: tuple[int, ...]
    host_block_ids: tuple[int, ...]
    block_hashes: tuple[bytes, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StorePlan:
    """Device -> host copies. ``timing``: :data:`BEFORE_FORWARD` (eviction stores: the
    device blocks were just handed to another request; copy them out before this step's
    forward pass, and before this step's loads) or :data:`AFTER_FORWARD` (write-through
    stores: the step computes these blocks). The host blocks are readable only after
    ``complete_store(plan, True)``; ``complete_store(plan, False)`` frees them."""

    plan_id: int
    timing: str
    groups: tuple[GroupStore, ...]

    @property
    def num_blocks(self) -> int:
        """Blocks copied, all groups together."""
        return sum(len(g.device_block_ids) for g in self.groups)
