"""Spec transformations and the group layout: hybrid-off promotion, attention/state page
unification, and layers dealt to equally sized groups (vLLM 0.33's rules)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from pagedkv.core.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    cdiv,
    merge_specs,
)
from pagedkv.errors import ConfigError, InvalidArgumentError
from pagedkv.planner.plan_types import (
    DEFAULT_KERNEL_BLOCK_ALIGNMENT,
    KVCacheGroup,
    PageUnification,
    group_blocks_per_request,
)

__all__ = [
    "BlockRules",
    "Layout",
    "build_layout",
    "cost_windows_as_full",
    "promote_windows_for_hybrid_off",
    "unify_page_sizes",
]

# -- spec transformations ------------------------------------------------------------------


def cost_windows_as_full(layer_to_spec: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """The specs with every sliding-window and chunked-local layer costed as full attention
    (the window / chunk is recorded on the full spec), as engines do with the hybrid
    allocator off. Other specs are unchanged. Pure."""
    out: dict[str, KVCacheSpec] = {}
    for name, spec in layer_to_spec.items():
        if isinstance(spec, SlidingWindowSpec):
            out[name] = FullAttentionSpec(
                block_size=spec.block_size, num_kv_heads=spec.num_kv_heads,
                head_size=spec.head_size, dtype_bytes=spec.dtype_bytes,
                sliding_window=spec.sliding_window,
            )
        elif isinstance(spec, ChunkedLocalAttentionSpec):
            out[name] = FullAttentionSpec(
                block_size=spec.block_size, num_kv_heads=spec.num_kv_heads,
                head_size=spec.head_size, dtype_bytes=spec.dtype_bytes,
                attention_chunk_size=spec.attention_chunk_size,
            )
        else:
            out[name] = spec
    return out


def promote_windows_for_hybrid_off(
    layer_to_spec: Mapping[str, KVCacheSpec],
) -> dict[str, KVCacheSpec]:
    """What vLLM 0.33 does with the hybrid allocator off; pure.

    A model of one kind stays as it is (an all-sliding model such as Mistral-7B keeps its
    window); full attention with sliding-window or chunked layers has those costed as full
    attention (:func:`cost_windows_as_full`); anything else (state layers next to
    attention) cannot be made one kind.

    Raises:
        ConfigError: the specs cannot be promoted to one kind (names the kinds).
    """
    specs = dict(layer_to_spec)
    kinds = {_kind_key(spec) for spec in specs.values()}
    if len(kinds) <= 1:
        return specs
    has_full = any(isinstance(s, FullAttentionSpec) for s in specs.values())
    if has_full:
        specs = cost_windows_as_full(specs)
    if len({_kind_key(spec) for spec in specs.values()}) > 1:
        names = sorted({spec.kind for spec in specs.values()})
        raise ConfigError(
            f"with the hybrid allocator off, layers of kinds {', '.join(names)} cannot be "
            "promoted to one KV-cache type (vLLM: \"Failed to promote local KV cache specs "
            "to one unified type\"); plan with the hybrid allocator on"
        )
    return specs


def unify_page_sizes(
    layer_to_spec: Mapping[str, KVCacheSpec],
    *,
    kernel_block_alignment: int = DEFAULT_KERNEL_BLOCK_ALIGNMENT,
) -> tuple[dict[str, KVCacheSpec], PageUnification | None]:
    """Make attention and state pages equal (Mamba hybrids); pure.

    The attention block size becomes ``max(requested, alignment x ceil(state /
    (alignment x attention bytes per token)))``; every attention spec takes it, and every
    state spec takes it as its block size and the attention page as its padded page.
    Without both attention and state layers the specs are returned unchanged with ``None``.

    Raises:
        ConfigError: attention layers of different bytes per token (one block size cannot
            give them equal pages).
        InvalidArgumentError: ``kernel_block_alignment`` not positive.
    """
    if kernel_block_alignment <= 0:
        raise InvalidArgumentError(
            f"kernel_block_alignment must be positive, got {kernel_block_alignment}"
        )
    states = [s for s in layer_to_spec.values() if isinstance(s, MambaSpec)]
    attention = [s for s in layer_to_spec.values() if not isinstance(s, MambaSpec)]
    if not states or not attention:
        return dict(layer_to_spec), None
    per_token = {s.bytes_per_token for s in attention}
    if len(per_token) > 1:
        a, b = sorted({s.describe() for s in attention})[:2]
        raise ConfigError(
            "attention layers with different bytes per token cannot be unified with a "
            f"state page: {a} and {b}"
        )
    token_bytes = per_token.pop()
    state_bytes = max(s.state_bytes for s in states)
    requested = max(s.block_size for s in attention)
    grown = kernel_block_alignment * cdiv(state_bytes, kernel_block_alignment * token_bytes)
    block_size = max(requested, grown)
    page = block_size * token_bytes
    out: dict[str, KVCacheSpec] = {}
    for name, spec in layer_to_spec.items():
        if isinstance(spec, MambaSpec):
            out[name] = replace(spec, block_size=block_size, page_size_padded_bytes=page)
        else:
            out[name] = spec.with_block_size(block_size)
    return out, PageUnification(
        requested_block_size=requested, block_size=block_size,
        kernel_block_alignment=kernel_block_alignment, page_size_bytes=page,
        state_bytes=state_bytes,
    )


def _kind_key(spec: KVCacheSpec) -> KVCacheSpec:
    """Specs with equal keys share groups (full attention ignores a recorded window)."""
    if isinstance(spec, FullAttentionSpec):
        return replace(spec, sliding_window=None, attention_chunk_size=None)
    return spec


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Groups of equal size (padding slots included) sharing one page size; per kind the
    layer and padding counts, for the plan's notes."""

    groups: tuple[KVCacheGroup, ...]
    group_size: int
    page_size_bytes: int
    kind_padding: tuple[tuple[str, int, int], ...]  # (kind, layers, padding layers)

    def bytes_for(self, max_model_len: int, rules: BlockRules) -> int:
        """Bytes of the blocks one request holds, plus the null block."""
        blocks = sum(rules.blocks(g.spec, max_model_len) for g in self.groups)
        return (blocks + 1) * self.page_size_bytes * self.group_size


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockRules:
    """How many blocks a request holds per group (see :func:`group_blocks_per_request`)."""

    max_in_flight_tokens: int | None
    mamba_cache_mode: str
    mamba_checkpoint_blocks: int

    def blocks(self, spec: KVCacheSpec, max_model_len: int) -> int:
        return group_blocks_per_request(
            spec, max_model_len, max_in_flight_tokens=self.max_in_flight_tokens,
            mamba_cache_mode=self.mamba_cache_mode,
            mamba_checkpoint_blocks=self.mamba_checkpoint_blocks,
        )


def build_layout(layer_to_spec: Mapping[str, KVCacheSpec]) -> Layout:
    """Group ``layer_to_spec`` as vLLM 0.33 does: one bucket per kind (in order of first
    appearance), group size the smallest bucket's layer count unless the largest has fewer
    than 1.5x as many (then the largest's), each bucket dealt out in turn
    (``layers[i::num_groups]``).

    Raises:
        ConfigError: layers whose page sizes differ.
    """
    kinds: dict[KVCacheSpec, list[str]] = {}
    for name, spec in layer_to_spec.items():
        kinds.setdefault(_kind_key(spec), []).append(name)
    pages = {key.page_size_bytes: key for key in kinds}
    if len(pages) > 1:
        (p1, s1), (p2, s2) = sorted(pages.items(), key=lambda item: item[0])[:2]
        raise ConfigError(
            "layers with unequal page sizes cannot share one block pool: "
            f"{s1.describe()} ({p1} bytes) and {s2.describe()} ({p2} bytes); only "
            "attention + state (Mamba) hybrids are unified"
        )
    counts = [len(names) for names in kinds.values()]
    group_size = min(counts)
    if max(counts) < 1.5 * group_size:
        group_size = max(counts)
    groups: list[KVCacheGroup] = []
    kind_padding: list[tuple[str, int, int]] = []
    for names in kinds.values():
        spec = merge_specs([layer_to_spec[name] for name in names])
        num_groups = cdiv(len(names), group_size)
        padding = num_groups * group_size - len(names)
        kind_padding.append((spec.kind, len(names), padding))
        for i in range(num_groups):
            chunk = tuple(names[i::num_groups])
            groups.append(KVCacheGroup(
                spec=spec, layer_names=chunk, num_padding_layers=group_size - len(chunk),
            ))
    return Layout(
        groups=tuple(groups), group_size=group_size, page_size_bytes=pages.popitem()[0],
        kind_padding=tuple(kind_padding),
    )
