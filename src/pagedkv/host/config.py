"""The host tier's configuration and its sizing in bytes.

One host block holds one device block (all layers of its group), so a host tier of
``host_bytes`` holds ``host_bytes // bytes_per_block`` blocks, where a device block takes
``page_size_bytes * group_size`` bytes in the planner's layout (every layer slot of the
shared tensors; see :class:`pagedkv.planner.KVCachePlan`).

>>> from pagedkv.core.specs import FullAttentionSpec
>>> spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
>>> spec.page_size_bytes              # K and V, 16 tokens, 8 heads of 128, 2 bytes
65536
>>> host_blocks_for_bytes(256 * 2**30, spec.page_size_bytes * 32)   # 32 layers, 256 GiB
131072
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from pagedkv.checks import check_fits_memory, check_flag, check_whole
from pagedkv.errors import InvalidArgumentError
from pagedkv.host.policy import AdmissionRule, AdmitAll, StoreOnEviction, WritePolicy

if TYPE_CHECKING:
    from pagedkv.planner.plan import KVCachePlan

__all__ = ["HostTierSettings", "device_block_bytes", "host_blocks_for_bytes"]

#: Host bytes the tier's bookkeeping takes per block, at least: its free list alone holds a
#: list slot (8 bytes) and an int object (28 bytes) per block.
HOST_TIER_BYTES_PER_BLOCK = 36


def host_blocks_for_bytes(host_bytes: int, bytes_per_block: int) -> int:
    """Host blocks that fit in ``host_bytes`` when a block takes ``bytes_per_block``.

    Raises:
        InvalidArgumentError: a non-positive size, or room for no block at all.
    """
    if type(host_bytes) is not int or type(bytes_per_block) is not int or bytes_per_block <= 0:
        raise InvalidArgumentError(
            f"host_bytes and bytes_per_block must be ints, bytes_per_block > 0; got "
            f"{host_bytes!r} and {bytes_per_block!r}"
        )
    n = host_bytes // bytes_per_block
    if n < 1:
        raise InvalidArgumentError(
            f"{host_bytes} bytes of host memory hold no block of {bytes_per_block} bytes; "
            "give the host tier more memory"
        )
    return n


def device_block_bytes(plan: KVCachePlan) -> int:
    """Bytes of one device block in ``plan``'s layout: its page size times the layer
    slots per group (what one host block must hold).

    Raises:
        InvalidArgumentError: the plan has no groups.
    """
    page = plan.page_size_bytes
    if page is None or not plan.group_size:
        raise InvalidArgumentError("the plan has no KV-cache groups; nothing to offload")
    return page * plan.group_size


_S = TypeVar("_S", bound="HostTierSettings")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostTierSettings:
    """The fields of :class:`pagedkv.host.HostTierConfig`: a host tier of ``num_blocks``
    blocks.

    ``write_policy``: when blocks are stored (:class:`StoreOnEviction`, the default, or
    :class:`WriteThrough`). ``admission``: which offered blocks are stored
    (:class:`AdmitAll`, the default, or :class:`AdmitAfterHits`). ``enable_events``:
    record host stores/removals as events with medium ``"CPU"`` (``None``: whenever the
    device records events, ``CacheConfig.events_on``).

    Raises:
        InvalidArgumentError: ``num_blocks`` not an int >= 1, or a policy/rule of the wrong
            type.
    """

    num_blocks: int
    write_policy: WritePolicy = field(default_factory=StoreOnEviction)
    admission: AdmissionRule = field(default_factory=AdmitAll)
    enable_events: bool | None = None

    def __post_init__(self) -> None:
        check_whole("HostTierConfig.num_blocks", self.num_blocks, minimum=1)
        check_fits_memory("HostTierConfig.num_blocks", self.num_blocks,
                          HOST_TIER_BYTES_PER_BLOCK,
                          "size the tier from host memory (HostTierConfig.from_bytes)")
        if not isinstance(self.write_policy, WritePolicy):
            raise InvalidArgumentError(
                f"write_policy must be a WritePolicy (StoreOnEviction(), WriteThrough()), "
                f"got {self.write_policy!r}"
            )
        if self.enable_events is not None:
            check_flag("HostTierConfig.enable_events", self.enable_events)
        if not isinstance(self.admission, AdmissionRule):
            raise InvalidArgumentError(
                f"admission must be an AdmissionRule (AdmitAll(), AdmitAfterHits(...)), "
                f"got {self.admission!r}"
            )

    @classmethod
    def from_bytes(
        cls: type[_S], host_bytes: int, bytes_per_block: int, *,
        write_policy: WritePolicy | None = None, admission: AdmissionRule | None = None,
        enable_events: bool | None = None,
    ) -> _S:
        """A tier of ``host_blocks_for_bytes(host_bytes, bytes_per_block)`` blocks
        (``bytes_per_block``: e.g. :func:`device_block_bytes` of the planner's plan)."""
        return cls(
            num_blocks=host_blocks_for_bytes(host_bytes, bytes_per_block),
            write_policy=write_policy if write_policy is not None else StoreOnEviction(),
            admission=admission if admission is not None else AdmitAll(),
            enable_events=enable_events,
        )
