"""The KV-cache plan's value types and the per-request block count vLLM 0.33 sizes by.

>>> from pagedkv.core.specs import FullAttentionSpec
>>> spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
>>> group_blocks_per_request(spec, 8192, max_in_flight_tokens=16384)
512
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pagedkv.core.specs import ChunkedLocalAttentionSpec, KVCacheSpec, MambaSpec, cdiv

__all__ = [
    "DEFAULT_KERNEL_BLOCK_ALIGNMENT",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "MAMBA_CACHE_MODES",
    "KVCacheGroup",
    "KVCachePlan",
    "KVCacheTensor",
    "PageUnification",
    "group_blocks_per_request",
]

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192

#: Attention kernels want block sizes that are a multiple of this.
DEFAULT_KERNEL_BLOCK_ALIGNMENT = 16

#: How Mamba state is kept per request: ``none`` (one live state; prefix caching off) or
#: ``align`` (prefix caching on: the running state, the previous block-boundary state and
#: the prefill checkpoints the mixer exports).
MAMBA_CACHE_MODES = ("none", "align")



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

    >>> from pagedkv.core.specs import SlidingWindowSpec
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
