"""Per-layer specs + bytes available -> a KV-cache plan: groups, tensors, ``num_blocks``.

The layout follows what vLLM does (SPEC 3.8):

* **one kind** of layer -> one group holding every layer; each layer gets its own tensor
  of ``num_blocks x page_size_bytes``; ``num_blocks = available // (page x num_layers)``.
* **several kinds, equal page size** -> each kind is cut into groups of ``group_size``
  layers (the layer count of the smallest kind); the last group of a kind is padded with
  empty slots. There are ``group_size`` tensors; tensor *i* is shared by layer *i* of every
  group (each group writes its own blocks of it), so
  ``num_blocks = available // (page x group_size)``.
* **unequal page sizes** (attention + Mamba state) -> first unified: the attention block
  size grows to a multiple of the kernel alignment until the attention page covers the
  state page; the state page is padded up to the attention page. Then as above.
* **no layers** -> a trivial plan: one (null) block, no group, no tensor.

Worked cases:

* Llama-3.1-8B, bf16, block 16, 10 GiB: page = 2 x 16 x 8 x 128 x 2 = 65,536 bytes;
  32 tensors; num_blocks = 10,737,418,240 // (65,536 x 32) = 5,120.
* Gemma-3-27B (10 full + 52 sliding): group size 10; full -> 1 group, sliding -> 6 groups
  (the last holds 2 layers + 8 padding slots); 10 tensors each shared by 7 layers or slots.
* Jamba-1.5-Mini (attention 4,096 bytes/token/layer, Mamba state 311,296 bytes):
  block = 16 x ceil(311,296 / (16 x 4,096)) = 80; page = 327,680; the state page is
  padded by 16,384 bytes (5.26 %); then 4 attention + 28 Mamba layers -> 8 groups of 4.

Layers of one kind are dealt to that kind's groups in turn (``layers[i::num_groups]``), and
the group size is the smallest kind's layer count unless the largest kind has fewer than
1.5 times as many layers, in which case it is the largest (vLLM 0.33's rules): Gemma-3-27B's
52 sliding layers make groups of 9, 9, 9, 9, 8, 8 layers.

Capacity is counted as vLLM 0.33 counts it (``kv_cache_utils.get_kv_cache_capacity``):
blocks per request are summed over groups, ``max_concurrency = num_blocks / blocks per
request`` (the null block is not subtracted) and the "GPU KV cache size" it logs is
``int(max_concurrency x max_model_len)`` tokens. :attr:`KVCachePlan.usable_concurrency`
is the figure with the null block held back. The memory check keeps one block back for
the null block, as vLLM does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pagedkv.errors import ConfigError, InsufficientMemoryError, InvalidArgumentError
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    cdiv,
    merge_specs,
)

__all__ = [
    "DEFAULT_KERNEL_BLOCK_ALIGNMENT",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "MAMBA_CACHE_MODES",
    "KVCacheGroup",
    "KVCachePlan",
    "KVCacheTensor",
    "PageUnification",
    "cost_windows_as_full",
    "estimate_max_model_len",
    "group_blocks_per_request",
    "plan_kv_cache",
    "promote_windows_for_hybrid_off",
    "unify_page_sizes",
    "unify_worker_plans",
]

#: Tokens one request may be scheduled in one step (vLLM's default for an API server on a
#: GPU). Windowed layers hold this many tokens beyond their window.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192

#: Attention kernels want block sizes that are a multiple of this.
DEFAULT_KERNEL_BLOCK_ALIGNMENT = 16

#: How Mamba state is kept per request: ``none`` (one live state; prefix caching off) or
#: ``align`` (prefix caching on: the running state, the previous block-boundary state and
#: the prefill checkpoints the mixer exports).
MAMBA_CACHE_MODES = ("none", "align")

_GiB = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class KVCacheGroup:
    """Layers that share one block table per request.

    ``num_padding_layers`` is how many slots the group leaves empty so that every group has
    the same number of layers (its blocks still reserve those slots in the shared tensors).
    """

    spec: KVCacheSpec
    layer_names: tuple[str, ...]
    num_padding_layers: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class KVCacheTensor:
    """One device tensor of ``size_bytes`` (``num_blocks`` pages), used by the layers in
    ``shared_by`` (at most one per group; each group uses its own blocks of it)."""

    size_bytes: int
    shared_by: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PageUnification:
    """How attention and state pages were made equal.

    ``block_size`` is the attention block size after growth (``requested_block_size`` when
    no growth was needed); ``page_size_bytes`` the common page; ``state_bytes`` the real
    (largest) state of one layer.
    """

    requested_block_size: int
    block_size: int
    kernel_block_alignment: int
    page_size_bytes: int
    state_bytes: int

    @property
    def state_padding_bytes(self) -> int:
        """Bytes added to each state page."""
        return self.page_size_bytes - self.state_bytes

    @property
    def state_padding_pct(self) -> float:
        """Padding as a percentage of the real state."""
        return 100.0 * self.state_padding_bytes / self.state_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class KVCachePlan:
    """A KV-cache layout and its capacity for one worker.

    ``available_bytes`` is the memory the plan was made for; ``max_model_len`` and
    ``max_num_batched_tokens`` the request bounds it was checked against (``None`` tokens
    per step = unbounded). ``hybrid`` is whether windowed layers keep their own groups.
    ``async_scheduling`` doubles the tokens in flight per request (two batches overlap);
    ``mamba_cache_mode`` / ``mamba_checkpoint_blocks`` say how state groups are held (see
    :data:`MAMBA_CACHE_MODES`); ``attention_backend`` names the backend whose block size
    was assumed (a label).
    """

    num_blocks: int
    groups: tuple[KVCacheGroup, ...]
    tensors: tuple[KVCacheTensor, ...]
    available_bytes: int
    max_model_len: int
    max_num_batched_tokens: int | None
    hybrid: bool = True
    page_unification: PageUnification | None = None
    notes: tuple[str, ...] = ()
    async_scheduling: bool = False
    mamba_cache_mode: str = "none"
    mamba_checkpoint_blocks: int = 0
    attention_backend: str | None = None

    # -- layout ------------------------------------------------------------------------------

    @property
    def block_size(self) -> int | None:
        """Tokens per block (the smallest of the groups); ``None`` without groups."""
        return min((g.spec.block_size for g in self.groups), default=None)

    @property
    def page_size_bytes(self) -> int | None:
        """Bytes of one block of one layer (equal across groups); ``None`` without groups."""
        return self.groups[0].spec.page_size_bytes if self.groups else None

    @property
    def group_size(self) -> int:
        """Layer slots per group (= number of tensors)."""
        return max((len(g.layer_names) + g.num_padding_layers for g in self.groups), default=0)

    @property
    def num_layers(self) -> int:
        return sum(len(g.layer_names) for g in self.groups)

    @property
    def num_padding_layers(self) -> int:
        return sum(g.num_padding_layers for g in self.groups)

    @property
    def padding_waste_fraction(self) -> float:
        """Share of the layer slots of all groups that are padding: the most of the KV
        memory padding can waste (0.0 without padding)."""
        slots = len(self.groups) * self.group_size
        return self.num_padding_layers / slots if slots else 0.0

    @property
    def total_bytes(self) -> int:
        """Bytes of all tensors."""
        return sum(t.size_bytes for t in self.tensors)

    def layer_to_group(self) -> dict[str, int]:
        """Layer name -> index of its group, in group order."""
        return {name: i for i, g in enumerate(self.groups) for name in g.layer_names}

    def layer_to_tensor(self) -> dict[str, int]:
        """Layer name -> index of the tensor it lives in."""
        return {name: i for i, t in enumerate(self.tensors) for name in t.shared_by}

    # -- capacity ----------------------------------------------------------------------------

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token costs across all layers (state excluded)."""
        return sum(len(g.layer_names) * g.spec.bytes_per_token for g in self.groups)

    @property
    def max_in_flight_tokens(self) -> int | None:
        """Tokens a request may have scheduled but not settled: one batch, two with async
        scheduling; ``None`` when batches are unbounded."""
        if self.max_num_batched_tokens is None:
            return None
        return self.max_num_batched_tokens * (2 if self.async_scheduling else 1)

    def group_blocks(self, group: KVCacheGroup) -> int:
        """Blocks one request of ``max_model_len`` tokens holds in ``group``."""
        return group_blocks_per_request(
            group.spec, self.max_model_len, max_in_flight_tokens=self.max_in_flight_tokens,
            mamba_cache_mode=self.mamba_cache_mode,
            mamba_checkpoint_blocks=self.mamba_checkpoint_blocks,
        )

    @property
    def blocks_per_request(self) -> int:
        """Blocks one request of ``max_model_len`` tokens holds, summed over groups."""
        return sum(self.group_blocks(g) for g in self.groups)

    @property
    def usable_blocks(self) -> int:
        """Blocks that can hold data (all but the null block)."""
        return max(self.num_blocks - 1, 0)

    @property
    def kv_tokens(self) -> int:
        """Token slots per group: ``usable_blocks // num_groups x block_size`` (pagedkv's
        conservative figure: every group holding every token); 0 without groups. Not the
        figure vLLM logs: that is :attr:`kv_cache_size_tokens`."""
        if not self.groups or self.block_size is None:
            return 0
        return self.usable_blocks // len(self.groups) * self.block_size

    @property
    def max_concurrency(self) -> float | None:
        """Requests of ``max_model_len`` tokens that fit at once, as vLLM 0.33 reports it:
        ``num_blocks / blocks_per_request``; ``None`` without groups."""
        if not self.groups:
            return None
        return self.num_blocks / self.blocks_per_request

    @property
    def usable_concurrency(self) -> float | None:
        """:attr:`max_concurrency` with the null block held back: ``usable_blocks /
        blocks_per_request`` (what the manager can actually admit)."""
        if not self.groups:
            return None
        return self.usable_blocks / self.blocks_per_request

    @property
    def kv_cache_size_tokens(self) -> int | None:
        """The "GPU KV cache size" vLLM 0.33 logs: ``int(max_concurrency x
        max_model_len)``. Windowed groups hold only their windows, so a hybrid layout
        shows its savings here."""
        concurrency = self.max_concurrency
        return None if concurrency is None else int(concurrency * self.max_model_len)

    @property
    def tokens_at_max_model_len(self) -> int | None:
        """Alias of :attr:`kv_cache_size_tokens`."""
        return self.kv_cache_size_tokens

    @property
    def vllm_log_line(self) -> str | None:
        """The capacity line vLLM 0.33 logs at start-up, formatted as it formats it."""
        if self.max_concurrency is None:
            return None
        return (f"GPU KV cache size: {self.kv_cache_size_tokens:,} tokens, Maximum "
                f"concurrency for {self.max_model_len:,} tokens per request: "
                f"{self.max_concurrency:.2f}x")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description: layout, capacity figures and notes."""
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "page_size_bytes": self.page_size_bytes,
            "hybrid": self.hybrid,
            "available_bytes": self.available_bytes,
            "total_bytes": self.total_bytes,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "async_scheduling": self.async_scheduling,
            "max_in_flight_tokens": self.max_in_flight_tokens,
            "mamba_cache_mode": self.mamba_cache_mode,
            "mamba_checkpoint_blocks": self.mamba_checkpoint_blocks,
            "attention_backend": self.attention_backend,
            "kv_tokens": self.kv_tokens,
            "kv_cache_size_tokens": self.kv_cache_size_tokens,
            "tokens_at_max_model_len": self.tokens_at_max_model_len,
            "max_concurrency": self.max_concurrency,
            "usable_concurrency": self.usable_concurrency,
            "vllm_log_line": self.vllm_log_line,
            "blocks_per_request": self.blocks_per_request if self.groups else 0,
            "bytes_per_token": self.bytes_per_token,
            "num_padding_layers": self.num_padding_layers,
            "padding_waste_fraction": self.padding_waste_fraction,
            "page_unification": None if self.page_unification is None else {
                **dataclasses.asdict(self.page_unification),
                "state_padding_bytes": self.page_unification.state_padding_bytes,
                "state_padding_pct": self.page_unification.state_padding_pct,
            },
            "groups": [
                {
                    "kind": g.spec.kind,
                    "spec": {"class": type(g.spec).__name__, **dataclasses.asdict(g.spec)},
                    "page_size_bytes": g.spec.page_size_bytes,
                    "layers": list(g.layer_names),
                    "num_padding_layers": g.num_padding_layers,
                    "blocks_per_request": self.group_blocks(g),
                }
                for g in self.groups
            ],
            "tensors": [
                {"size_bytes": t.size_bytes, "shared_by": list(t.shared_by)}
                for t in self.tensors
            ],
            "notes": list(self.notes),
        }


# -- per-request blocks -------------------------------------------------------------------


def group_blocks_per_request(
    spec: KVCacheSpec,
    max_model_len: int,
    *,
    max_in_flight_tokens: int | None,
    mamba_cache_mode: str = "none",
    mamba_checkpoint_blocks: int = 0,
) -> int:
    """Blocks one request of ``max_model_len`` tokens holds in a group of ``spec``, as vLLM
    0.33 sizes the pool (``max_memory_usage_bytes / page``); pure.

    * full attention / MLA: ``cdiv(max_model_len, block)``;
    * sliding window: ``cdiv(min(window - 1 + in_flight, max_model_len), block) + 1``;
    * chunked local: ``cdiv(min(chunk + in_flight, max_model_len), block)`` (no extra
      block);
    * Mamba state: 1 block (``none``), or ``2 + checkpoint blocks`` (``align``);
    * other kinds: their own ``max_admission_blocks``.

    ``max_in_flight_tokens`` is the tokens scheduled but not settled per request
    (``max_num_batched_tokens``, doubled with async scheduling; ``None`` = unbounded).

    >>> from pagedkv.specs import SlidingWindowSpec
    >>> swa = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128,
    ...                         dtype_bytes=2, sliding_window=4096)
    >>> group_blocks_per_request(swa, 32768, max_in_flight_tokens=2 * 8192)
    1281
    """
    if isinstance(spec, MambaSpec):
        return 2 + mamba_checkpoint_blocks if mamba_cache_mode == "align" else 1
    if isinstance(spec, ChunkedLocalAttentionSpec):
        step = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
        return cdiv(min(spec.attention_chunk_size + step, max_model_len), spec.block_size)
    return spec.max_admission_blocks(max_model_len,
                                     max_num_batched_tokens=max_in_flight_tokens)


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
class _Layout:
    groups: tuple[KVCacheGroup, ...]
    group_size: int
    page_size_bytes: int
    kind_padding: tuple[tuple[str, int, int], ...]  # (kind, layers, padding layers)

    def bytes_for(self, max_model_len: int, rules: _Rules) -> int:
        """Bytes of the blocks one request holds, plus the null block."""
        blocks = sum(rules.blocks(g.spec, max_model_len) for g in self.groups)
        return (blocks + 1) * self.page_size_bytes * self.group_size


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rules:
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


def _layout(layer_to_spec: Mapping[str, KVCacheSpec]) -> _Layout:
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
    return _Layout(
        groups=tuple(groups), group_size=group_size, page_size_bytes=pages.popitem()[0],
        kind_padding=tuple(kind_padding),
    )


# -- memory check ------------------------------------------------------------------------------


def _max_len_that_fits(layout: _Layout, available_bytes: int, upper: int,
                       rules: _Rules) -> int:
    """Largest length in ``[1, upper]`` whose request fits, by binary search; 0 if none.
    O(log upper) evaluations."""
    low, high, best = 1, upper, 0
    while low <= high:
        mid = (low + high) // 2
        if layout.bytes_for(mid, rules) <= available_bytes:
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best


def _rules(max_num_batched_tokens: int | None, async_scheduling: bool,
           mamba_cache_mode: str, mamba_checkpoint_blocks: int) -> _Rules:
    if mamba_cache_mode not in MAMBA_CACHE_MODES:
        raise InvalidArgumentError(
            f"mamba_cache_mode must be one of {', '.join(MAMBA_CACHE_MODES)}, got "
            f"{mamba_cache_mode!r}"
        )
    if not isinstance(mamba_checkpoint_blocks, int) or mamba_checkpoint_blocks < 0:
        raise InvalidArgumentError(
            f"mamba_checkpoint_blocks must be a non-negative int, got "
            f"{mamba_checkpoint_blocks!r}"
        )
    in_flight = None if max_num_batched_tokens is None else \
        max_num_batched_tokens * (2 if async_scheduling else 1)
    return _Rules(max_in_flight_tokens=in_flight, mamba_cache_mode=mamba_cache_mode,
                  mamba_checkpoint_blocks=mamba_checkpoint_blocks)


def estimate_max_model_len(
    layer_to_spec: Mapping[str, KVCacheSpec],
    available_bytes: int,
    *,
    upper: int,
    max_num_batched_tokens: int | None = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    hybrid: bool = True,
    kernel_block_alignment: int = DEFAULT_KERNEL_BLOCK_ALIGNMENT,
    async_scheduling: bool = True,
    mamba_cache_mode: str = "none",
    mamba_checkpoint_blocks: int = 0,
) -> int:
    """The largest ``max_model_len`` in ``[1, upper]`` for which one request (plus the null
    block) fits in ``available_bytes`` under the layout :func:`plan_kv_cache` would build;
    0 if not even one token fits. Binary search, O(log upper) layout evaluations.

    Raises:
        ConfigError: the specs cannot be laid out (see :func:`plan_kv_cache`).
    """
    specs = _prepared(layer_to_spec, hybrid, kernel_block_alignment)[0]
    if not specs:
        return upper
    rules = _rules(max_num_batched_tokens, async_scheduling, mamba_cache_mode,
                   mamba_checkpoint_blocks)
    return _max_len_that_fits(_layout(specs), available_bytes, upper, rules)


def _prepared(
    layer_to_spec: Mapping[str, KVCacheSpec], hybrid: bool, alignment: int
) -> tuple[dict[str, KVCacheSpec], PageUnification | None]:
    specs = dict(layer_to_spec) if hybrid else promote_windows_for_hybrid_off(layer_to_spec)
    return unify_page_sizes(specs, kernel_block_alignment=alignment)


def _bytes_text(num_bytes: int) -> str:
    return f"{num_bytes:,} bytes ({num_bytes / _GiB:.2f} GiB)"


# -- the planner -----------------------------------------------------------------------------


def plan_kv_cache(
    layer_to_spec: Mapping[str, KVCacheSpec],
    *,
    available_bytes: int,
    max_model_len: int,
    max_num_batched_tokens: int | None = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    hybrid: bool = True,
    num_blocks: int | None = None,
    kernel_block_alignment: int = DEFAULT_KERNEL_BLOCK_ALIGNMENT,
    model_name: str | None = None,
    async_scheduling: bool = True,
    mamba_cache_mode: str = "none",
    mamba_checkpoint_blocks: int = 0,
    attention_backend: str | None = None,
) -> KVCachePlan:
    """Lay out the KV cache of ``layer_to_spec`` (layer name -> spec, model order) in
    ``available_bytes`` of one worker; pure.

    ``hybrid=False`` is vLLM's hybrid allocator off: sliding-window and chunked layers next
    to full attention are costed as full attention; a model of one kind stays as it is;
    state layers next to attention are refused. ``async_scheduling`` (vLLM's default)
    lets two batches be in flight, so windowed layers hold ``2 x max_num_batched_tokens``
    beyond their window. ``mamba_cache_mode`` / ``mamba_checkpoint_blocks`` say how state
    groups are held (:func:`group_blocks_per_request`). ``num_blocks`` overrides the
    computed count (tensors are sized by it). ``model_name`` only labels error messages;
    ``attention_backend`` only labels the plan.

    Raises:
        InsufficientMemoryError: one request of ``max_model_len`` tokens (plus the null
            block) does not fit; states needed and available bytes and the largest
            ``max_model_len`` that fits.
        ConfigError: a ``num_blocks`` override too small for one such request (one over
            the memory is planned with a warning note); layers whose pages cannot be made
            equal;
            kinds the hybrid-off rules cannot promote.
        InvalidArgumentError: negative ``available_bytes``; non-positive ``max_model_len``,
            ``max_num_batched_tokens`` or ``num_blocks``; an unknown ``mamba_cache_mode``.
    """
    for label, value in (("max_model_len", max_model_len),
                         ("max_num_batched_tokens", max_num_batched_tokens),
                         ("num_blocks", num_blocks)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value <= 0):
            raise InvalidArgumentError(f"{label} must be a positive int, got {value!r}")
    if not isinstance(available_bytes, int) or available_bytes < 0:
        raise InvalidArgumentError(
            f"available_bytes must be a non-negative int, got {available_bytes!r}"
        )
    rules = _rules(max_num_batched_tokens, async_scheduling, mamba_cache_mode,
                   mamba_checkpoint_blocks)
    specs, unification = _prepared(layer_to_spec, hybrid, kernel_block_alignment)
    notes: list[str] = []
    if not hybrid and any(
        isinstance(s, SlidingWindowSpec | ChunkedLocalAttentionSpec) for s in specs.values()
    ):
        notes.append("hybrid allocator off: the model has one attention kind, so its "
                     "windows are kept")
    elif not hybrid and any(
        isinstance(s, SlidingWindowSpec | ChunkedLocalAttentionSpec)
        for s in layer_to_spec.values()
    ):
        notes.append("sliding-window and chunked layers costed as full attention")
    if unification is not None:
        if unification.block_size != unification.requested_block_size:
            notes.append(
                f"attention block size grown from {unification.requested_block_size} to "
                f"{unification.block_size} tokens (a multiple of "
                f"{unification.kernel_block_alignment}) so that its page covers the state"
            )
        notes.append(
            f"state page padded from {unification.state_bytes:,} to "
            f"{unification.page_size_bytes:,} bytes ({unification.state_padding_pct:.2f} %)"
        )
    if not specs:
        return KVCachePlan(
            num_blocks=1, groups=(), tensors=(), available_bytes=available_bytes,
            max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
            hybrid=hybrid, notes=("attention-free model: no KV cache",),
            async_scheduling=async_scheduling, mamba_cache_mode=mamba_cache_mode,
            mamba_checkpoint_blocks=mamba_checkpoint_blocks,
            attention_backend=attention_backend,
        )
    layout = _layout(specs)
    for kind, count, padding in layout.kind_padding:
        if padding:
            notes.append(
                f"{padding} padding layers added to the {count} {kind} layers; they may "
                f"waste up to {100 * padding / count:.2f} % of that kind's KV memory"
            )
    needed = layout.bytes_for(max_model_len, rules)
    per_block = layout.page_size_bytes * layout.group_size
    if num_blocks is None and needed > available_bytes:
        fits = _max_len_that_fits(layout, available_bytes, max_model_len, rules)
        advice = (f"the largest max_model_len that fits is {fits:,}" if fits
                  else "not even a one-token request fits")
        who = f"{model_name}: " if model_name else ""
        raise InsufficientMemoryError(
            f"{who}one request of max_model_len {max_model_len:,} tokens needs "
            f"{_bytes_text(needed)} of KV cache, but only {_bytes_text(available_bytes)} "
            f"is available; {advice}. Lower max_model_len, or give the KV cache more "
            "memory (higher GPU memory utilization, more tensor parallelism, fp8 KV cache)",
            needed_bytes=needed, available_bytes=available_bytes,
            max_model_len_that_fits=fits,
        )
    if num_blocks is None:
        num_blocks = available_bytes // per_block
    else:
        minimum = needed // per_block
        if num_blocks < minimum:
            raise ConfigError(
                f"num_blocks override {num_blocks:,} is below the {minimum:,} blocks one "
                f"request of max_model_len {max_model_len:,} needs (null block included)"
            )
        fits_blocks = available_bytes // per_block
        notes.append(f"num_blocks overridden: {num_blocks:,} (memory would give "
                     f"{fits_blocks:,})")
        if num_blocks > fits_blocks:
            notes.append(f"WARNING: the overridden blocks need "
                         f"{_bytes_text(num_blocks * per_block)}, more than the "
                         f"{_bytes_text(available_bytes)} available")
    tensor_bytes = num_blocks * layout.page_size_bytes
    tensors = tuple(
        KVCacheTensor(
            size_bytes=tensor_bytes,
            shared_by=tuple(g.layer_names[i] for g in layout.groups if i < len(g.layer_names)),
        )
        for i in range(layout.group_size)
    )
    return KVCachePlan(
        num_blocks=num_blocks, groups=layout.groups, tensors=tensors,
        available_bytes=available_bytes, max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens, hybrid=hybrid,
        page_unification=unification, notes=tuple(notes),
        async_scheduling=async_scheduling, mamba_cache_mode=mamba_cache_mode,
        mamba_checkpoint_blocks=mamba_checkpoint_blocks, attention_backend=attention_backend,
    )


def _group_key(group: KVCacheGroup) -> tuple[str, str, int]:
    return (type(group.spec).__name__, group.spec.describe(), len(group.layer_names))


def unify_worker_plans(plans: Sequence[KVCachePlan]) -> tuple[KVCachePlan, ...]:
    """Make the plans of several workers agree so one manager can drive them all; pure.

    The groups of every worker must match (compared sorted by spec, so their order may
    differ); every plan gets the smallest ``num_blocks`` (tensors keep their size: using only
    the first blocks of a tensor is valid).

    Raises:
        ConfigError: two workers' groups differ (names the worker and both group lists).
        InvalidArgumentError: no plans.
    """
    if not plans:
        raise InvalidArgumentError("unify_worker_plans needs at least one plan")
    reference = sorted(_group_key(g) for g in plans[0].groups)
    for index, plan in enumerate(plans[1:], start=1):
        keys = sorted(_group_key(g) for g in plan.groups)
        if keys != reference:
            raise ConfigError(
                f"worker {index}'s KV-cache groups differ from worker 0's: "
                f"{[k[1] for k in keys]} vs {[k[1] for k in reference]}"
            )
    smallest = min(plan.num_blocks for plan in plans)
    return tuple(replace(plan, num_blocks=smallest) for plan in plans)
