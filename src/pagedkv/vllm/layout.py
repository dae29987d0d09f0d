"""vLLM 0.33's KV-cache layout (``KVCacheConfig``) as pagedkv layer specs, or a refusal.

Every group maps to one pagedkv spec that runs exactly as vLLM's manager for that kind,
or the whole layout is refused at construction with one line naming the kind and the
fallback (:class:`UnsupportedLayoutError`): never a silent divergence.

==========================================  =========================================
vLLM spec                                   pagedkv
==========================================  =========================================
FullAttentionSpec (and uniform groups)      FullAttentionSpec
MLAAttentionSpec                            MLAAttentionSpec
SlidingWindowSpec                           SlidingWindowSpec
SlidingWindowMLASpec (bounded replay too)   SlidingWindowMLASpec (``specs_window_mla``)
ChunkedLocalAttentionSpec                   ChunkedLocalAttentionSpec
SinkFullAttentionSpec                       SinkFullAttentionSpec
CrossAttentionSpec                          CrossAttentionSpec (sized by the encoder)
MambaSpec, ``mamba_cache_mode="align"``     MambaSpec
==========================================  =========================================

A bounded-replay SWA-MLA group never joins lookups (its part of a hit is empty) and
must share the block size of every other group (vLLM aligns hits to the scheduler block).

Refused (:data:`REFUSED_KINDS`): R-SWA, circular
buffers, HiSparse host tiers, hidden-state caches, encoder-only groups, Mamba in any
mode but ``align`` (with caching on) or with speculative or prefill-checkpoint blocks,
Mamba hybrids without a full-attention group (with caching on).
"""

from __future__ import annotations

import math
from typing import Any

from pagedkv.core.config import CacheConfig
from pagedkv.core.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.core.specs_window_mla import SlidingWindowMLASpec
from pagedkv.errors import ConfigError

__all__ = ["FALLBACK", "REFUSED_KINDS", "UnsupportedLayoutError", "check_prefill_lookahead",
           "pagedkv_spec"]

#: What a user does when a layout is refused.
FALLBACK = "run vLLM without --scheduler-cls (its own KV-cache manager)"

#: vLLM spec class name -> why pagedkv refuses it.
REFUSED_KINDS: dict[str, str] = {
    "RSWASpec": "R-SWA (sliding window with a retained prompt gap) is not implemented",
    "CircularBufferSpec": "circular-buffer attention is not implemented",
    "HiSparseHotSpec": "HiSparse host tiers are not implemented",
    "HiSparseResidentSpec": "HiSparse host tiers are not implemented",
    "HiddenStateCacheSpec": "hidden-state caches are not implemented",
    "EncoderOnlyAttentionSpec": "encoder-only attention groups are not implemented",
}


class UnsupportedLayoutError(ConfigError):
    """A vLLM layout or scheduler option pagedkv cannot run exactly; the message is one
    line naming it and the fallback."""


def refuse(what: str) -> UnsupportedLayoutError:
    """The refusal for ``what`` (one line, fallback named)."""
    return UnsupportedLayoutError(f"pagedkv.vllm refuses {what}; {FALLBACK}")


def eagle_layout_problem(groups: Any) -> str | None:
    """What of a layout of several KV-cache groups pagedkv does not run exactly under the
    EAGLE last-block drop with prefix caching (None: it runs it block for block, see
    :mod:`pagedkv.core.eagle_hits`): the drop in some groups only (vLLM drops in the
    groups flagged ``is_eagle_group`` when any is; pagedkv drops in all), two groups of
    one spec (vLLM looks them up jointly), or a group whose block is not the layout's
    block lcm outside Mamba (vLLM aligns such a group's run before and after the drop)."""
    groups = list(groups)
    if len(groups) < 2:
        return None
    flagged = [bool(getattr(g, "is_eagle_group", False)) for g in groups]
    if any(flagged) and not all(flagged):
        return "a layout whose drafter owns some of its KV-cache groups only"
    specs = [g.kv_cache_spec for g in groups]
    if any(a == b for i, a in enumerate(specs) for b in specs[i + 1:]):
        return "a layout with two KV-cache groups of one spec"
    lcm = math.lcm(*(int(x.block_size) for x in specs))
    if any(int(x.block_size) != lcm and type(x).__name__ != "MambaSpec" for x in specs):
        return "a layout whose attention groups have different block sizes"
    return None


def _dtype_bytes(spec: Any) -> int:
    dtype = getattr(spec, "dtype", None)
    size = getattr(dtype, "itemsize", None)
    return int(size) if size else 2


def _attention_fields(spec: Any) -> dict[str, int]:
    return dict(block_size=int(spec.block_size), num_kv_heads=max(1, int(spec.num_kv_heads)),
                head_size=max(1, int(spec.head_size)), dtype_bytes=_dtype_bytes(spec))


def _mamba(spec: Any, group: int, enable_caching: bool) -> KVCacheSpec:
    if spec.num_speculative_blocks or getattr(spec, "num_prefill_checkpoint_blocks", 0):
        raise refuse(f"group {group}: a Mamba group with speculative or prefill-checkpoint "
                     "state blocks (not implemented)")
    if enable_caching and spec.mamba_cache_mode != "align":
        raise refuse(f"group {group}: a Mamba group with mamba_cache_mode="
                     f"{spec.mamba_cache_mode!r} and prefix caching on (pagedkv runs 'align')")
    return MambaSpec(block_size=int(spec.block_size), state_bytes=int(spec.page_size_bytes))


def _window_mla(spec: Any, group: int) -> KVCacheSpec:
    """DeepSeek-V4's sliding-window MLA group (bounded replay or not), or a refusal."""
    if getattr(spec, "extra_retained_tokens", 0):
        raise refuse(f"group {group}: SlidingWindowMLASpec retaining "
                     f"{spec.extra_retained_tokens} extra tokens (prefill lookahead)")
    return SlidingWindowMLASpec(**_attention_fields(spec), sliding_window=int(spec.sliding_window),
                                bounded_replay=bool(spec.bounded_replay))


def pagedkv_spec(spec: Any, group: int, enable_caching: bool,
                 max_encoder_len: int = 0) -> KVCacheSpec:
    """The pagedkv spec for vLLM group ``group``'s spec.

    Raises:
        UnsupportedLayoutError: a kind pagedkv does not run exactly (module docstring).
    """
    from vllm.v1 import kv_cache_interface as kci

    name = type(spec).__name__
    if name in REFUSED_KINDS:
        raise refuse(f"group {group}: {name}: {REFUSED_KINDS[name]}")
    if type(spec) is kci.SlidingWindowMLASpec:
        return _window_mla(spec, group)
    if getattr(spec, "prefix_replay_tokens", 0):
        raise refuse(f"group {group}: {name} with prefix replay (not implemented)")
    if isinstance(spec, kci.UniformTypeKVCacheSpecs):
        inner = {type(s) for s in spec.kv_cache_specs.values()}
        if inner != {kci.FullAttentionSpec}:
            raise refuse(f"group {group}: a uniform group of {sorted(c.__name__ for c in inner)}")
        return FullAttentionSpec(block_size=int(spec.block_size), num_kv_heads=1,
                                 head_size=1, dtype_bytes=2)
    if isinstance(spec, kci.MambaSpec):
        return _mamba(spec, group, enable_caching)
    if type(spec) is kci.SinkFullAttentionSpec:
        if not spec.sink_len:
            return FullAttentionSpec(**_attention_fields(spec))
        return SinkFullAttentionSpec(**_attention_fields(spec), sink_len=int(spec.sink_len))
    if type(spec) is kci.MLAAttentionSpec:
        return MLAAttentionSpec(**_attention_fields(spec))
    if type(spec) is kci.FullAttentionSpec:
        if spec.sliding_window is not None or spec.attention_chunk_size is not None:
            raise refuse(f"group {group}: full attention costing a windowed layer "
                         "(hybrid allocator off; not implemented)")
        return FullAttentionSpec(**_attention_fields(spec))
    if type(spec) is kci.SlidingWindowSpec:
        return SlidingWindowSpec(**_attention_fields(spec),
                                 sliding_window=int(spec.sliding_window))
    if type(spec) is kci.ChunkedLocalAttentionSpec:
        return ChunkedLocalAttentionSpec(**_attention_fields(spec),
                                         attention_chunk_size=int(spec.attention_chunk_size))
    if type(spec) is kci.CrossAttentionSpec:
        return CrossAttentionSpec(**_attention_fields(spec),
                                  max_encoder_len=max(1, max_encoder_len))
    raise refuse(f"group {group}: {name} (an attention kind pagedkv does not know)")


def check_prefill_lookahead(kv_cache_config: Any, scheduler_block_size: int, lookahead: int,
                            *, eagle_drop: bool, enable_caching: bool) -> None:
    """vLLM's coordinator rule for multi-module MTP, raised as vLLM raises it: with
    prefix caching on and EAGLE groups (those flagged ``is_eagle_group``, or every group
    under the EAGLE drop), the scheduler block size must be at least the prefill
    lookahead.

    Raises:
        ConfigError: (a ValueError) vLLM's message, when the rule fails.
    """
    if not lookahead or not enable_caching:
        return
    flagged = any(getattr(g, "is_eagle_group", False)
                  for g in kv_cache_config.kv_cache_groups)
    if (flagged or eagle_drop) and scheduler_block_size < lookahead:
        raise ConfigError(
            f"Multi-module MTP with prefix caching requires scheduler_block_size"
            f" (={scheduler_block_size}) >= num_speculative_tokens (={lookahead}).")


def cache_config_for(kv_cache_config: Any, *, max_model_len: int, max_encoder_len: int = 0,
                     **fields: Any) -> CacheConfig:
    """The pagedkv :class:`CacheConfig` for a vLLM ``KVCacheConfig``; ``fields`` are
    further CacheConfig fields (``enable_caching`` among them); ``max_encoder_len``: the
    longest encoder input (vLLM's ``max_num_encoder_input_tokens``), for cross attention.

    Raises:
        UnsupportedLayoutError: a group pagedkv refuses.
    """
    enable_caching = bool(fields.get("enable_caching", True))
    # vLLM zeroes new blocks with a Mamba group or groups of different precisions.
    fields.setdefault("zero_new_blocks",
                      bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", False)) or None)
    if getattr(kv_cache_config, "hisparse_host_num_blocks", None) is not None:
        raise refuse("HiSparse host blocks (not implemented)")
    groups = tuple(pagedkv_spec(g.kv_cache_spec, i, enable_caching, max_encoder_len)
                   for i, g in enumerate(kv_cache_config.kv_cache_groups))
    if not groups:
        raise refuse("a layout without KV-cache groups (an attention-free model)")
    replayed = [g for g in groups if isinstance(g, SlidingWindowMLASpec) and g.bounded_replay]
    if replayed and len({g.block_size for g in groups}) > 1:
        raise refuse("a bounded-replay SWA-MLA group beside groups of other block sizes "
                     f"({sorted({g.block_size for g in groups})}; hits align to one block)")
    kinds = {type(g).__name__ for g in groups}
    if (enable_caching and "MambaSpec" in kinds and len(kinds) > 1
            and not kinds & {"FullAttentionSpec", "MLAAttentionSpec", "SinkFullAttentionSpec"}):
        raise refuse("a Mamba hybrid without a full-attention group, prefix caching on "
                     "(its shared-prefix junction is not implemented)")
    if enable_caching and "MambaSpec" in kinds:
        # vLLM's align-mode Mamba manager offers every registered state to a connector.
        fields.setdefault("record_boundary_states", True)
    return CacheConfig(groups=groups, num_blocks=int(kv_cache_config.num_blocks),
                       max_model_len=int(max_model_len), **fields)
