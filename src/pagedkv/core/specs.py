"""Layer KV-cache specs: how one attention layer stores KV, and what that costs.

A spec is a frozen value. Layers whose specs are equal can share one KV-cache *group* (one
block table per request); :func:`merge_specs` checks that and names both specs when they
differ.

Every spec answers three questions:

* ``page_size_bytes``: bytes of one block of one layer;
* ``max_memory_usage_bytes(max_model_len, ...)``: the most one request can hold;
* ``max_admission_blocks(max_model_len, ...)``: the same bound in blocks. The planner sizes
  the pool with it and the manager admits requests with it, so what the plan promised at
  start-up is exactly what the manager admits at run time.

Worked cases (bf16, 8 KV heads, head size 128, block size 16):

* full attention: page = 2 x 16 x 8 x 128 x 2 = 65,536 bytes; ``max_model_len`` 1000
  -> ceil(1000 / 16) = 63 blocks.
* sliding window 128, at most 256 tokens scheduled per step: min(127 + 256, 1000) = 383
  tokens -> ceil(383 / 16) + 1 = 25 blocks (the +1: the window need not start on a block
  boundary).
* chunked local, chunk 256, 256 tokens per step: min(256 + 256, 1000) = 512 -> 32 + 1 = 33.

>>> heads = {"num_kv_heads": 8, "head_size": 128, "dtype_bytes": 2, "block_size": 16}
>>> full = FullAttentionSpec(**heads)
>>> full.page_size_bytes, full.max_admission_blocks(1000)
(65536, 63)
>>> SlidingWindowSpec(sliding_window=128, **heads).max_admission_blocks(
...     1000, max_num_batched_tokens=256)
25
>>> ChunkedLocalAttentionSpec(attention_chunk_size=256, **heads).max_admission_blocks(
...     1000, max_num_batched_tokens=256)
33
>>> merge_specs([full, FullAttentionSpec(**heads)]) == full
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import ClassVar, TypeVar

from pagedkv.arg_types import check_fields
from pagedkv.errors import InvalidArgumentError, SpecMergeError

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "KVCacheSpec",
    "MLAAttentionSpec",
    "MambaSpec",
    "SinkFullAttentionSpec",
    "SlidingWindowSpec",
    "cdiv",
    "merge_specs",
]

_S = TypeVar("_S", bound="KVCacheSpec")


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


def _positive(name: str, value: int | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class KVCacheSpec:
    """Base of all layer specs: a block of ``block_size`` token slots.

    Subclasses set ``kind`` (the name used in plans and layer files) and implement
    ``page_size_bytes`` and ``max_memory_usage_bytes``. ``event_kind`` is the name KV-cache
    events carry (vLLM 0.33's ``KVCacheSpecKind`` value); it is ``kind`` except where
    vLLM spells it otherwise.
    """

    kind: ClassVar[str] = "abstract"
    event_kind: ClassVar[str] = "abstract"
    #: Whether a model with a group of this kind zeroes new blocks by default (vLLM 0.33's
    #: ``needs_kv_cache_zeroing``: a Mamba group; ``CacheConfig.zero_new_blocks``).
    zeroes_kv_by_default: ClassVar[bool] = False
    #: Whether this group's new blocks are recorded for zeroing when zeroing is on.
    zeroable: ClassVar[bool] = False
    block_size: int

    def __post_init__(self) -> None:
        check_fields(self)
        _positive("block_size", self.block_size)

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer."""
        raise NotImplementedError

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token costs in one layer (page size / block size)."""
        return self.page_size_bytes // self.block_size

    def max_memory_usage_bytes(
        self, max_model_len: int, *, max_num_batched_tokens: int | None = None
    ) -> int:
        """The most memory one request of up to ``max_model_len`` tokens can hold, in bytes.

        ``max_num_batched_tokens`` is the most tokens a request can be scheduled in one step
        (windowed kinds hold that many beyond their window); ``None`` means unbounded
        (``max_model_len``).
        """
        return self.max_admission_blocks(
            max_model_len, max_num_batched_tokens=max_num_batched_tokens
        ) * self.page_size_bytes

    def max_admission_blocks(
        self, max_model_len: int, *, max_num_batched_tokens: int | None = None
    ) -> int:
        """Per-request admission cap in blocks; the single source of truth for the planner
        (pool sizing) and the manager (admission)."""
        raise NotImplementedError

    @property
    def event_sliding_window(self) -> int | None:
        """The ``sliding_window`` KV-cache events carry for this group (None: none)."""
        return None

    def with_block_size(self: _S, block_size: int) -> _S:
        """The same spec with another block size."""
        return replace(self, block_size=block_size)

    def describe(self) -> str:
        """One line for error messages and plans."""
        parts = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)]
        return f"{type(self).__name__}({', '.join(parts)})"


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """Attention layers that store a K and a V vector per token and KV head."""

    zeroable: ClassVar[bool] = True
    num_kv_heads: int
    head_size: int
    dtype_bytes: int

    def __post_init__(self) -> None:
        KVCacheSpec.__post_init__(self)
        _positive("num_kv_heads", self.num_kv_heads)
        _positive("head_size", self.head_size)
        _positive("dtype_bytes", self.dtype_bytes)

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Full (causal) attention: every token attends to every earlier token.

    ``sliding_window`` / ``attention_chunk_size`` record the real attention pattern of a
    windowed layer that is *costed* as full attention because the hybrid allocator is off;
    the manager then keeps every block.
    """

    kind: ClassVar[str] = "full_attention"
    event_kind: ClassVar[str] = "full_attention"
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        _positive("sliding_window", self.sliding_window, allow_none=True)
        _positive("attention_chunk_size", self.attention_chunk_size, allow_none=True)

    @property
    def event_sliding_window(self) -> int | None:
        return self.sliding_window

    def max_admission_blocks(
        self, max_model_len: int, *, max_num_batched_tokens: int | None = None
    ) -> int:
        return cdiv(max_model_len, self.block_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention (DeepSeek V2/V3): one latent vector per token, no separate
    K and V, so no factor 2. ``head_size`` is the latent width (kv_lora_rank + rope dim) and
    ``num_kv_heads`` is 1."""

    kind: ClassVar[str] = "mla_attention"
    event_kind: ClassVar[str] = "mla_attention"

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_size * self.dtype_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkFullAttentionSpec(FullAttentionSpec):
    """Full attention with ``sink_len`` learned attention-sink tokens held per request."""

    kind: ClassVar[str] = "full_attention_sink"
    event_kind: ClassVar[str] = "sink_full_attention"  # vLLM 0.33's name
    sink_len: int

    def __post_init__(self) -> None:
        FullAttentionSpec.__post_init__(self)
        _positive("sink_len", self.sink_len)

    def max_admission_blocks(
        self, max_model_len: int, *, max_num_batched_tokens: int | None = None
    ) -> int:
        return cdiv(self.sink_len, self.block_size) + cdiv(max_model_len, self.block_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Sliding-window attention: a token attends to itself and the ``sliding_window - 1``
    tokens before it."""

    kind: ClassVar[str] = "sliding_window"
    event_kind: ClassVar[str] = "sliding_window"
    sliding_window: int

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        _positive("sliding_window", self.sliding_window)

    @property
    def event_sliding_window(self) -> int | None:
        return self.sliding_window

    def max_admission_blocks(
        self, max_model_len: int, *, max_num_batched_tokens: int | None = None
    ) -> int:
        step = max_model_len if max_num_batched_tokens is None else max_num_batched_tokens
        num_tokens = min(self.sliding_window - 1 + step, max_model_len)
        return cdiv(num_tokens, self.block_size) + 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Chunked local attention (Llama 4): tokens attend only within their
    ``attention_chunk_size``-token chunk."""

    kind: ClassVar[str] = "chunked_local_attention"
    event_kind: ClassVar[str] = "chunked_local_attention"
    attention_chunk_size: int

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        _positive("attention_chunk_size", self.attention_chunk_size)

    def max_admission_blocks(
        self, max_model_len: int, *, max_num_batched_tokens: int | None = None
    ) -> int:
        step = max_model_len if max_num_batched_tokens is None else max_num_batched_tokens
        num_tokens = min(self.attention_chunk_size + step, max_model_len)
        return cdiv(num_tokens, self.block_size) + 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CrossAttentionSpec(AttentionSpec):
    """Cross attention of an encoder-decoder model: KV of the encoder output, sized by the
    encoder length (``max_encoder_len``), allocated once, never prefix-cached."""

    kind: ClassVar[str] = "cross_attention"
    event_kind: ClassVar[str] = "cross_attention"
    max_encoder_len: int

    def __post_init__(self) -> None:
        AttentionSpec.__post_init__(self)
        _positive("max_encoder_len", self.max_encoder_len)

    def max_admission_blocks(
        self, max_model_len: int, *, max_num_batched_tokens: int | None = None
    ) -> int:
        return cdiv(self.max_encoder_len, self.block_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """Mamba / linear-attention state: a fixed-size state per request, independent of length.

    ``state_bytes`` is the real size of one request's state in one layer (conv + SSM
    state, or the delta-net state); ``page_size_padded_bytes`` pads it to match the page of
    other groups when the planner unifies page sizes.

    ``block_size`` is the token span a state block stands for. With prefix caching on and
    ``cache_checkpoints=False`` (the default) the group behaves as vLLM 0.33's
    ``mamba_cache_mode="align"``: one live state block at position ``ceil(tokens /
    block_size) - 1``, registered once that block is full (see
    :mod:`pagedkv.core.managers.mamba`); with caching off, one state block whatever the length.
    ``cache_checkpoints=True`` is an older pagedkv option (not vLLM's behaviour): the state
    is kept at every ``block_size`` boundary of the prompt, each registered as it is passed.
    """

    kind: ClassVar[str] = "mamba"
    event_kind: ClassVar[str] = "mamba"
    zeroes_kv_by_default: ClassVar[bool] = True
    state_bytes: int
    page_size_padded_bytes: int | None = None
    cache_checkpoints: bool = False

    def __post_init__(self) -> None:
        KVCacheSpec.__post_init__(self)
        _positive("state_bytes", self.state_bytes)
        _positive("page_size_padded_bytes", self.page_size_padded_bytes, allow_none=True)
        padded = self.page_size_padded_bytes
        if padded is not None and padded < self.state_bytes:
            raise InvalidArgumentError(
                f"page_size_padded_bytes ({self.page_size_padded_bytes}) is smaller than "
                f"state_bytes ({self.state_bytes}); padding can only grow a page"
            )

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded_bytes is not None:
            return self.page_size_padded_bytes
        return self.state_bytes

    @property
    def bytes_per_token(self) -> int:
        return 0

    def max_admission_blocks(
        self, max_model_len: int, *, max_num_batched_tokens: int | None = None
    ) -> int:
        """Align mode (the default) holds up to 2 state blocks between steps: the state
        the next step starts from and the block it writes, once a step crosses a block
        boundary (the older one goes on the next allocation), as vLLM 0.33's align-mode
        bound ``2 + num_speculative_blocks + num_prefill_checkpoint_blocks`` with both 0;
        the planner's ``mamba_cache_mode="align"`` figure is the same. With caching off
        one block is held, so 2 bounds both.

        >>> MambaSpec(block_size=16, state_bytes=4096).max_admission_blocks(1024)
        2
        """
        if self.cache_checkpoints:
            return cdiv(max_model_len, self.block_size)
        return 2


def merge_specs(specs: Sequence[_S]) -> _S:
    """The one spec that stands for ``specs`` (layers that will share one group).

    Specs merge when they are of the same class and equal in every field, except that
    full-attention specs that differ only in the *recorded* window or chunk (hybrid
    allocator off) merge into one spec that records none.

    Raises:
        SpecMergeError: two specs differ; the message names both.
        InvalidArgumentError: ``specs`` is empty.
    """
    if not specs:
        raise InvalidArgumentError("merge_specs needs at least one spec")
    first = specs[0]
    merged = first
    for other in specs[1:]:
        if other == first:
            continue
        if (
            type(other) is type(first)
            and isinstance(first, FullAttentionSpec)
            and isinstance(other, FullAttentionSpec)
            and replace(other, sliding_window=None, attention_chunk_size=None)
            == replace(first, sliding_window=None, attention_chunk_size=None)
        ):
            merged = replace(first, sliding_window=None, attention_chunk_size=None)
            continue
        raise SpecMergeError(
            "these layer specs cannot share one KV-cache group: "
            f"{first.describe()} and {other.describe()}; put the layers in separate groups "
            "or make their specs equal"
        )
    return merged


def lcm_block_size(specs: Sequence[KVCacheSpec]) -> int:
    """Least common multiple of the specs' block sizes (hybrid hit alignment)."""
    out = 1
    for spec in specs:
        out = out * spec.block_size // math.gcd(out, spec.block_size)
    return out
