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

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NoReturn

from pagedkv.core.specs import ChunkedLocalAttentionSpec, KVCacheSpec, SlidingWindowSpec
from pagedkv.errors import ConfigError, InsufficientMemoryError, InvalidArgumentError
from pagedkv.planner.layout import (
    BlockRules,
    Layout,
    build_layout,
    cost_windows_as_full,
    promote_windows_for_hybrid_off,
    unify_page_sizes,
)
from pagedkv.planner.plan_types import (
    DEFAULT_KERNEL_BLOCK_ALIGNMENT,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    MAMBA_CACHE_MODES,
    KVCacheGroup,
    KVCachePlan,
    KVCacheTensor,
    PageUnification,
    group_blocks_per_request,
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

_GiB = 1 << 30


# -- memory check ------------------------------------------------------------------------------


def _max_len_that_fits(layout: Layout, available_bytes: int, upper: int,
                       rules: BlockRules) -> int:
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
           mamba_cache_mode: str, mamba_checkpoint_blocks: int) -> BlockRules:
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
    return BlockRules(max_in_flight_tokens=in_flight, mamba_cache_mode=mamba_cache_mode,
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
    return _max_len_that_fits(build_layout(specs), available_bytes, upper, rules)


def _prepared(
    layer_to_spec: Mapping[str, KVCacheSpec], hybrid: bool, alignment: int
) -> tuple[dict[str, KVCacheSpec], PageUnification | None]:
    specs = dict(layer_to_spec) if hybrid else promote_windows_for_hybrid_off(layer_to_spec)
    return unify_page_sizes(specs, kernel_block_alignment=alignment)


def _bytes_text(num_bytes: int) -> str:
    return f"{num_bytes:,} bytes ({num_bytes / _GiB:.2f} GiB)"


def _check_sizes(
    available_bytes: int, max_model_len: int, max_num_batched_tokens: int | None,
    num_blocks: int | None,
) -> None:
    """Raise InvalidArgumentError for a non-positive count or negative bytes."""
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


def _preparation_notes(
    layer_to_spec: Mapping[str, KVCacheSpec], specs: Mapping[str, KVCacheSpec], hybrid: bool,
    unification: PageUnification | None,
) -> list[str]:
    """The plan's notes on what preparing the specs did (windows promoted or kept, the
    attention block grown, the state page padded)."""
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
    return notes


def _refuse_insufficient(
    model_name: str | None, max_model_len: int, needed: int, available_bytes: int, fits: int
) -> NoReturn:
    """Raise InsufficientMemoryError: one request of ``max_model_len`` needs ``needed``
    bytes; ``fits`` is the largest length that fits (0: none)."""
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

    >>> from pagedkv.planner import load_model_spec
    >>> gemma = load_model_spec("Gemma-3-27B-it").layer_to_spec
    >>> plan = plan_kv_cache(gemma, available_bytes=20 << 30, max_model_len=32768)
    >>> [len(g.layer_names) for g in plan.groups], plan.blocks_per_request
    ([9, 9, 9, 9, 8, 8, 10], 8582)

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
    _check_sizes(available_bytes, max_model_len, max_num_batched_tokens, num_blocks)
    rules = _rules(max_num_batched_tokens, async_scheduling, mamba_cache_mode,
                   mamba_checkpoint_blocks)
    specs, unification = _prepared(layer_to_spec, hybrid, kernel_block_alignment)
    notes = _preparation_notes(layer_to_spec, specs, hybrid, unification)
    if not specs:
        return KVCachePlan(
            num_blocks=1, groups=(), tensors=(), available_bytes=available_bytes,
            max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
            hybrid=hybrid, notes=("attention-free model: no KV cache",),
            async_scheduling=async_scheduling, mamba_cache_mode=mamba_cache_mode,
            mamba_checkpoint_blocks=mamba_checkpoint_blocks,
            attention_backend=attention_backend,
        )
    layout = build_layout(specs)
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
        _refuse_insufficient(model_name, max_model_len, needed, available_bytes, fits)
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
