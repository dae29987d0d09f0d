"""The manager's configuration: one frozen value, built by hand or from a planner result.

>>> from pagedkv.core.specs import FullAttentionSpec
>>> spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
>>> config = CacheConfig(groups=(spec,), num_blocks=1024, max_model_len=8192)
>>> config.enable_caching, config.hash_algo
(True, 'sha256_cbor')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

from pagedkv.arg_types import check_fields
from pagedkv.checks import check_fits_memory, check_flag, check_whole
from pagedkv.core.components import ComponentSpec, PublisherSpec
from pagedkv.core.hashing import HASH_ALGOS
from pagedkv.core.specs import KVCacheSpec, lcm_block_size
from pagedkv.errors import ConfigError, InvalidArgumentError

__all__ = ["HOST_BYTES_PER_BLOCK", "VLLM_RELEASES", "CacheConfig"]

#: Host memory the pool's bookkeeping takes per block (measured: ~104 bytes,
#: benchmarks/scaling.py), rounded up.
HOST_BYTES_PER_BLOCK = 110


def _check_host_memory(num_blocks: int) -> None:
    check_fits_memory("num_blocks", num_blocks, HOST_BYTES_PER_BLOCK,
                      "size num_blocks from the KV-cache memory (pagedkv plan, or "
                      "CacheConfig.from_plan)", error=ConfigError)


def _check_fields(config: CacheConfig) -> None:
    """Each field's type on its own (:mod:`pagedkv.checks`): specs in ``groups``, flags
    True/False, counts whole numbers (not bool), bytes for the seed."""
    if not isinstance(config.groups, (tuple, list)) or not all(
            isinstance(g, KVCacheSpec) for g in config.groups):
        raise InvalidArgumentError(
            f"CacheConfig.groups must be a tuple of layer specs (FullAttentionSpec(...), "
            f"...), got {config.groups!r:.200}")
    for name in ("enable_caching", "enable_events", "drop_last_hit"):
        check_flag(f"CacheConfig.{name}", getattr(config, name))
    check_whole("CacheConfig.max_model_len", config.max_model_len, minimum=1)
    check_whole("CacheConfig.hit_rate_window_requests", config.hit_rate_window_requests,
                minimum=1)
    check_whole("CacheConfig.hash_memo_blocks", config.hash_memo_blocks, minimum=0)
    check_whole("CacheConfig.num_prefill_lookahead_tokens",
                config.num_prefill_lookahead_tokens, minimum=0)
    check_flag("CacheConfig.record_boundary_states", config.record_boundary_states)
    if config.hash_block_size is not None:
        check_whole("CacheConfig.hash_block_size", config.hash_block_size, minimum=1)
    if config.secret_seed is not None and type(config.secret_seed) is not bytes:
        raise InvalidArgumentError(
            f"CacheConfig.secret_seed must be bytes or None, got {config.secret_seed!r:.60}")


def _check_prefill_lookahead(config: CacheConfig) -> None:
    """vLLM's coordinator rule: with the EAGLE drop and caching on, the scheduler block
    size (the lcm of the group block sizes) is at least the prefill lookahead."""
    lookahead = config.num_prefill_lookahead_tokens
    if not (lookahead and config.drop_last_hit and config.enable_caching):
        return
    scheduler_block_size = lcm_block_size(config.groups)
    if scheduler_block_size < lookahead:
        raise ConfigError(
            f"Multi-module MTP with prefix caching requires scheduler_block_size "
            f"(={scheduler_block_size}) >= num_speculative_tokens (={lookahead}); use "
            "larger blocks, fewer speculative tokens, or turn prefix caching off")


#: The vLLM release series a manager can match block for block (``CacheConfig.vllm_release``).
VLLM_RELEASES = ("0.32", "0.33")


def _check_release(release: object, lookahead: int) -> None:
    """``vllm_release`` names a known series, and 0.32 runs without hash lookahead."""
    if release not in VLLM_RELEASES:
        raise InvalidArgumentError(
            f"CacheConfig.vllm_release must be one of {', '.join(VLLM_RELEASES)}, got "
            f"{release!r:.40}; leave it out for the newest")
    if release == "0.32" and lookahead:
        raise InvalidArgumentError(
            "num_hash_lookahead_tokens needs vllm_release='0.33' (vLLM 0.32 has no hash "
            "lookahead); set it to 0 or use 0.33")


class _PlanGroup(Protocol):
    @property
    def spec(self) -> KVCacheSpec: ...


class PlanLike(Protocol):
    """What :meth:`CacheConfig.from_plan` reads of a planner result
    (:class:`pagedkv.planner.KVCachePlan`)."""

    @property
    def groups(self) -> Sequence[_PlanGroup]: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...


#: The shortcut component fields, kept for callers (``components`` is the mechanism):
#: field -> the façade attribute its component is reachable as, ``None`` when the field
#: is. Each value is checked against :class:`ComponentSpec` and attached before
#: ``components``, in this order (:meth:`CacheConfig.component_specs`). The only place the
#: core spells a feature's name.
SHORTCUTS: dict[str, str] = {"retention": "retention", "observe": "observe",
                             "host_tier": "host"}
_COMPONENT_FIELDS = tuple(SHORTCUTS)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """Everything a :class:`~pagedkv.KVCacheManager` needs.

    ``groups``: one layer spec per KV-cache group (the planner produces them).
    ``hash_block_size``: block size hashes are computed at; default the smallest group
    block size (every group block size must be a multiple of it).
    ``drop_last_hit``: speculative decoding whose draft head needs the last block's hidden
    states; the last hit block is dropped so it is recomputed.
    ``hash_memo_blocks``: how many recently hashed blocks the hasher remembers so repeated
    prefixes are not re-hashed (0: off); see :class:`pagedkv.BlockHasher`.
    ``watermark``: fraction of ``num_blocks`` (``int(watermark * num_blocks)`` blocks)
    kept free when a request that holds no blocks (new or preempted) is admitted while
    other requests are scheduled (``allocate_slots(..., has_scheduled_reqs=True)``, the
    default), as vLLM's ``watermark``; 0 (default): no headroom.
    ``kv_events``: publish KV-cache events over ZeroMQ in vLLM's wire format (implies
    ``enable_events``; needs the ``events`` extra); see
    :meth:`~pagedkv.KVCacheManager.publish_events`.
    ``retention``: priorities, pins and tenant quotas (``None``: vLLM's LRU, unchanged);
    see :mod:`pagedkv.retention`. ``observe``: miss attribution and residency sampling
    (:class:`pagedkv.observe.ObserveConfig`). ``host_tier``: a host-memory tier
    (:class:`pagedkv.host.HostTierConfig`). ``components``: further component specs.
    The four combine freely; each is a component spec (:mod:`pagedkv.core.components`);
    ``components`` is the mechanism and the other three are shortcut fields kept for
    callers (:data:`SHORTCUTS`). A component is reached, typed, by
    ``mgr.component(Kind)``; the shortcut fields' also as ``mgr.retention``,
    ``mgr.observe``, ``mgr.host``.
    ``max_in_flight_tokens``: the most tokens scheduled but not yet settled (one batch per
    concurrent step; vLLM's ``max_in_flight_tokens``); sets the admission cap of sliding
    window and chunked local groups under ``allocate_slots(...,
    full_sequence_must_fit=True)``. ``None`` (default): ``max_model_len``.
    ``zero_new_blocks``: record the attention blocks each allocation takes, for the engine
    to zero (:meth:`~pagedkv.KVCacheManager.take_new_block_ids`); ``None`` (default): when
    the model has a Mamba group, as vLLM's ``needs_kv_cache_zeroing`` (pass ``True`` for a
    cache mixing KV precisions across groups).
    ``num_hash_lookahead_tokens``: L, the tokens after each block its hash also covers
    (vLLM's ``num_hash_lookahead_tokens``, for EAGLE/MTP drafters whose KV at a block's
    last position depends on the next L tokens); a block is hashed, hence cached, only once
    L more tokens are known; see :mod:`pagedkv.core.hashing_lookahead`. 0 (default): off.
    ``num_prefill_lookahead_tokens``: P, the prefill tokens past the computed range a
    drafter reads (vLLM's ``num_prefill_lookahead_tokens``: 1 for EAGLE-family drafters,
    the speculative token count for multi-module MTP); the last ``max(0, P - 1)`` computed
    tokens may be prefilled again, so they are not registered (see
    :mod:`pagedkv.core.reprefill`). 0 (default): off.
    ``record_boundary_states``: record each Mamba state the cache registers (and each
    sub-block state copy), for a KV connector to offload
    (:meth:`~pagedkv.KVCacheManager.take_boundary_state_offloads`, vLLM's boundary-state
    offloads); off by default, since the records wait to be taken.
    ``vllm_release``: the vLLM release series whose manager this one matches block for
    block (``VLLM_RELEASES``; default the newest). ``"0.32"``: no hash lookahead, and
    :meth:`~pagedkv.KVCacheManager.pop_blocks_for_free` keeps a table's leading null
    blocks (0.33 trims them); see ``pagedkv.vllm.compat.DIFFERENCES``.

    Raises:
        InvalidArgumentError: no groups, ``num_blocks`` not an int >= 2, a non-positive
            ``max_model_len``, an unknown ``hash_algo``, a ``watermark`` outside [0, 1], a
            ``max_in_flight_tokens`` that is not a positive int, a non-bool
            ``zero_new_blocks``, a ``num_hash_lookahead_tokens`` that is not an int >= 0,
            a ``vllm_release`` not in ``VLLM_RELEASES``, or hash lookahead under 0.32;
            a ``num_prefill_lookahead_tokens`` that is not an int >= 0.
        ConfigError: ``drop_last_hit`` with caching and a prefill lookahead longer than
            the least common multiple of the group block sizes (vLLM's multi-module MTP
            rule: the dropped tail must hold the re-prefilled tokens); ``num_blocks`` so
            large that the pool's bookkeeping (about ``HOST_BYTES_PER_BLOCK`` bytes of
            host memory per block) cannot fit in this machine's memory.
    """

    groups: tuple[KVCacheSpec, ...]
    num_blocks: int
    max_model_len: int
    enable_caching: bool = True
    hash_algo: str = "sha256_cbor"
    hash_block_size: int | None = None
    secret_seed: bytes | None = None
    enable_events: bool = False
    drop_last_hit: bool = False
    hit_rate_window_requests: int = 1000
    kv_events: PublisherSpec | None = None
    hash_memo_blocks: int = 16384
    watermark: float = 0.0
    retention: ComponentSpec | None = None
    max_in_flight_tokens: int | None = None
    zero_new_blocks: bool | None = None
    num_hash_lookahead_tokens: int = 0
    num_prefill_lookahead_tokens: int = 0
    record_boundary_states: bool = False
    vllm_release: str = "0.33"
    observe: ComponentSpec | None = None
    host_tier: ComponentSpec | None = None
    components: tuple[ComponentSpec, ...] = ()

    def __post_init__(self) -> None:
        self._check_components()
        if type(self.num_hash_lookahead_tokens) is not int or self.num_hash_lookahead_tokens < 0:
            raise InvalidArgumentError(
                f"num_hash_lookahead_tokens must be an int >= 0, got "
                f"{self.num_hash_lookahead_tokens!r}; 0 turns hash lookahead off"
            )
        _check_release(self.vllm_release, self.num_hash_lookahead_tokens)
        if not self.groups:
            raise InvalidArgumentError("CacheConfig.groups needs at least one layer spec")
        _check_fields(self)
        if self.max_in_flight_tokens is not None and (
                type(self.max_in_flight_tokens) is not int or self.max_in_flight_tokens < 1):
            raise InvalidArgumentError(
                f"max_in_flight_tokens must be a positive int or None, got "
                f"{self.max_in_flight_tokens!r}; pass the scheduler's token budget per step "
                "times the steps in flight"
            )
        if self.zero_new_blocks is not None and type(self.zero_new_blocks) is not bool:
            raise InvalidArgumentError(
                f"zero_new_blocks must be None, True or False, got {self.zero_new_blocks!r}"
            )
        if (type(self.watermark) not in (int, float) or not 0.0 <= self.watermark <= 1.0):
            raise InvalidArgumentError(
                f"watermark must be a fraction of num_blocks in [0, 1], got "
                f"{self.watermark!r}; vLLM's default is 0.0"
            )
        if type(self.num_blocks) is not int or self.num_blocks < 2:
            raise InvalidArgumentError(
                f"num_blocks must be an int >= 2 (block 0 is the null block), got "
                f"{self.num_blocks!r}"
            )
        _check_host_memory(self.num_blocks)
        if not isinstance(self.max_model_len, int) or self.max_model_len <= 0:
            raise InvalidArgumentError(
                f"max_model_len must be a positive int, got {self.max_model_len!r}"
            )
        if self.hash_algo not in HASH_ALGOS:
            raise InvalidArgumentError(
                f"unknown hash_algo {self.hash_algo!r}; choose one of {HASH_ALGOS}"
            )
        _check_prefill_lookahead(self)
        check_fields(self)  # what the rules above leave: 64-bit, finite, Unicode

    def _check_components(self) -> None:
        for name in _COMPONENT_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, ComponentSpec):
                raise InvalidArgumentError(
                    f"CacheConfig.{name} must be a component spec (an object with "
                    f"attach(build)), got {type(value).__name__}; see the field's docs")
        if self.kv_events is not None and not isinstance(self.kv_events, PublisherSpec):
            raise InvalidArgumentError(
                f"CacheConfig.kv_events must be a pagedkv.events.KVEventsConfig, got "
                f"{type(self.kv_events).__name__}")
        if not isinstance(self.components, tuple) or not all(
                isinstance(c, ComponentSpec) for c in self.components):
            raise InvalidArgumentError(
                "CacheConfig.components must be a tuple of component specs (objects with "
                f"attach(build)), got {self.components!r}")

    def component_specs(self) -> list[ComponentSpec]:
        """Every component spec in attach order: the shortcut fields' (``retention``,
        ``observe``, ``host_tier``, those set), then ``components``."""
        named = (getattr(self, name) for name in _COMPONENT_FIELDS)
        return [s for s in named if s is not None] + list(self.components)

    @staticmethod
    def shortcut_attributes() -> tuple[str, ...]:
        """The façade attributes the shortcut fields' components are reachable as
        (``mgr.retention``, ``mgr.observe``, ``mgr.host``; ``None`` when absent)."""
        return tuple(SHORTCUTS.values())

    @property
    def events_on(self) -> bool:
        """Whether the manager records events (``enable_events`` or ``kv_events``)."""
        return self.enable_events or self.kv_events is not None

    @classmethod
    def from_plan(cls, plan: PlanLike, **fields_: Any) -> CacheConfig:
        """The config for a planner result: its groups' specs (in group order), its
        ``num_blocks`` and, unless given, its ``max_model_len``; any other field by name,
        as for the constructor (so this can never lag behind the fields).

        >>> from pagedkv.planner import plan_kv_cache
        >>> from pagedkv.core.specs import FullAttentionSpec
        >>> spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128,
        ...                          dtype_bytes=2)
        >>> plan = plan_kv_cache({"layer.0": spec}, available_bytes=1 << 30,
        ...                      max_model_len=4096)
        >>> config = CacheConfig.from_plan(plan, watermark=0.01)
        >>> config.num_blocks == plan.num_blocks, config.groups == (spec,), config.watermark
        (True, True, 0.01)

        Raises:
            InvalidArgumentError: the plan has no groups (nothing to cache), or a keyword
                that is not a field (or is one the plan sets: ``groups``, ``num_blocks``).
        """
        if not plan.groups:
            raise InvalidArgumentError(
                "the plan has no KV-cache groups (a model without attention layers); "
                "there is nothing for a KV-cache manager to manage"
            )
        fields_.setdefault("max_model_len", plan.max_model_len)
        return cls.with_fields(groups=tuple(g.spec for g in plan.groups),
                               num_blocks=plan.num_blocks, **fields_)

    @classmethod
    def with_fields(cls, **fields_: Any) -> CacheConfig:
        """``CacheConfig(**fields_)``, refusing an unknown field by name (not TypeError).

        Raises:
            InvalidArgumentError: a keyword that is not a field; the fields listed.
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(fields_) - names)
        if unknown:
            raise InvalidArgumentError(
                f"unknown CacheConfig field(s) {unknown}; the fields are {sorted(names)}")
        return cls(**fields_)
