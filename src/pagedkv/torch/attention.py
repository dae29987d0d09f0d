"""Reference paged attention: write the new tokens' K/V into their slots, gather each
sequence's K/V through its block table, attend with the layer's mask.

It is written for exactness, not speed. Every query token attends over the same fixed
number of key positions (``context_len``, e.g. ``max_model_len``), whatever it actually
sees: invisible positions (masked, beyond the sequence, or in null blocks) are replaced by
``-inf`` scores and zero values *before* any arithmetic touches them. Every reduction is
along the last, contiguous dimension of a row of fixed length, and softmax works row by
row. So the arithmetic for one query token does not depend on which other tokens share
its batch, where its blocks physically are, or whether its prefix came from the cache or
was just computed: a run with prefix caching and one without give bitwise-equal outputs,
and NaN in a page the mask hides cannot leak in.

Shapes (``T`` new tokens, ``L`` = ``context_len``, ``Hq`` query heads, ``Hkv`` KV heads,
``Hq`` a multiple of ``Hkv``; query head ``h`` reads KV head ``h // (Hq / Hkv)``):
``query [T, Hq, D]`` -> ``out [T, Hq, Dv]``.

Masks (positions are token indices; a query at position ``q`` always sees itself):

* :class:`CausalMask`: keys ``0 .. q``;
* :class:`SlidingWindowMask` (window ``w``): keys ``q - w + 1 .. q``; window 4, q = 9 ->
  6, 7, 8, 9;
* :class:`ChunkedLocalMask` (chunk ``c``): keys ``q // c * c .. q``; chunk 8, q = 9 -> 8, 9.

Sinks: optional per-query-head logits ``[Hq]`` that join the softmax as one extra column
without a value (as in gpt-oss): they take probability mass, nothing else.
"""

from __future__ import annotations

from pagedkv.errors import InvalidArgumentError
from pagedkv.torch._deps import torch
from pagedkv.torch.tables import BatchTables

__all__ = [
    "AttentionMask",
    "CausalMask",
    "ChunkedLocalMask",
    "SlidingWindowMask",
    "attend",
    "gather_kv",
    "gather_latent",
    "paged_attention",
    "paged_latent_attention",
    "write_kv",
    "write_latent",
]

#: Query rows processed per chunk (bounds the gathered ``[rows, L, H, D]`` temporaries;
#: results do not depend on it).
ROWS_PER_CHUNK = 64


class AttentionMask:
    """Causal attention; subclasses narrow what a query sees."""

    def visible(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """``[T, L]`` bool: whether query ``t`` (position ``query_positions[t]``) sees key
        position ``key_positions[l]``. Pure."""
        return key_positions[None, :] <= query_positions[:, None]


class CausalMask(AttentionMask):
    """Full causal attention."""


class SlidingWindowMask(AttentionMask):
    """A query sees itself and the ``window - 1`` keys before it."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise InvalidArgumentError(f"sliding window must be >= 1, got {window}")
        self.window = window

    def visible(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        q, k = query_positions[:, None], key_positions[None, :]
        return (k <= q) & (k > q - self.window)


class ChunkedLocalMask(AttentionMask):
    """A query sees the keys of its own ``chunk``-token chunk up to itself."""

    def __init__(self, chunk: int) -> None:
        if chunk < 1:
            raise InvalidArgumentError(f"attention chunk must be >= 1, got {chunk}")
        self.chunk = chunk

    def visible(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        q, k = query_positions[:, None], key_positions[None, :]
        return (k <= q) & (k >= q // self.chunk * self.chunk)


# ---------------------------------------------------------------------- cache writes


def write_kv(
    kv_cache: torch.Tensor, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> None:
    """Store ``key``/``value`` ``[T, Hkv, D]`` at ``slot_mapping`` ``[T]`` of a
    ``[num_blocks, 2, block_size, Hkv, D]`` cache. Mutates ``kv_cache`` only at those slots.
    Slot ``s`` is block ``s // block_size``, offset ``s % block_size``."""
    block_size = kv_cache.shape[2]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    kv_cache[blocks, 0, offsets] = key
    kv_cache[blocks, 1, offsets] = value


def write_latent(latent_cache: torch.Tensor, slot_mapping: torch.Tensor,
                 latent: torch.Tensor) -> None:
    """Store ``latent`` ``[T, D]`` at ``slot_mapping`` of a ``[num_blocks, block_size, D]``
    MLA cache. Mutates only those slots."""
    block_size = latent_cache.shape[1]
    latent_cache[slot_mapping // block_size, slot_mapping % block_size] = latent


# ---------------------------------------------------------------------- gathers


def _columns(block_table: torch.Tensor, block_size: int, context_len: int) -> torch.Tensor:
    if context_len % block_size:
        raise InvalidArgumentError(
            f"context_len {context_len} must be a multiple of the block size {block_size}"
        )
    num_columns = context_len // block_size
    if block_table.shape[1] < num_columns:
        raise InvalidArgumentError(
            f"block table has {block_table.shape[1]} columns; context_len {context_len} needs "
            f"{num_columns}"
        )
    return block_table[:, :num_columns].long()


def gather_kv(
    kv_cache: torch.Tensor, block_table: torch.Tensor, context_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[B, context_len, Hkv, D]`` of every row of ``block_table`` in
    logical order (position ``p`` from column ``p // block_size``). Padding columns read
    the null block: callers mask those positions. Pure."""
    _, _, block_size, num_heads, head_size = kv_cache.shape
    pages = kv_cache[_columns(block_table, block_size, context_len)]  # [B, C, 2, bs, H, D]
    batch = pages.shape[0]
    key = pages[:, :, 0].reshape(batch, context_len, num_heads, head_size)
    value = pages[:, :, 1].reshape(batch, context_len, num_heads, head_size)
    return key, value


def gather_latent(
    latent_cache: torch.Tensor, block_table: torch.Tensor, context_len: int
) -> torch.Tensor:
    """Latents ``[B, context_len, D]`` in logical order (see :func:`gather_kv`). Pure."""
    _, block_size, width = latent_cache.shape
    pages = latent_cache[_columns(block_table, block_size, context_len)]  # [B, C, bs, D]
    return pages.reshape(pages.shape[0], context_len, width)


# ---------------------------------------------------------------------- attention


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    visible: torch.Tensor,
    *,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked attention of ``query [T, Hq, D]`` over per-query ``key [T, L, Hkv, D]`` and
    ``value [T, L, Hkv, Dv]`` with ``visible [T, L]``; returns ``[T, Hq, Dv]``. Hidden
    positions never enter the arithmetic (their scores become ``-inf`` and their values 0
    before use). Every row needs at least one visible key. Pure."""
    num_tokens, num_q_heads, head_size = query.shape
    num_kv_heads = key.shape[2]
    if num_q_heads % num_kv_heads:
        raise InvalidArgumentError(
            f"{num_q_heads} query heads cannot share {num_kv_heads} KV heads evenly"
        )
    group = num_q_heads // num_kv_heads
    context_len = key.shape[1]
    q = query.reshape(num_tokens, 1, num_kv_heads, group, head_size)
    scores = (q * key[:, :, :, None, :]).sum(-1) * scale  # [T, L, Hkv, G]
    scores = scores.reshape(num_tokens, context_len, num_q_heads).permute(0, 2, 1).contiguous()
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    if sinks is not None:
        sink_column = sinks.to(scores.dtype)[None, :, None].expand(num_tokens, num_q_heads, 1)
        probs = torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)  # [T, Hq, L]
    values = value.masked_fill(~visible[:, :, None, None], 0.0)
    values_t = values.permute(0, 2, 3, 1).contiguous()  # [T, Hkv, Dv, L]
    probs = probs.reshape(num_tokens, num_kv_heads, group, 1, context_len)
    out = (probs * values_t[:, :, None, :, :]).sum(-1)  # [T, Hkv, G, Dv]
    return out.reshape(num_tokens, num_q_heads, value.shape[-1])


def _attend_rows(
    query: torch.Tensor,
    per_request_key: torch.Tensor,
    per_request_value: torch.Tensor,
    tables: BatchTables,
    mask: AttentionMask,
    scale: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    context_len = per_request_key.shape[1]
    key_positions = torch.arange(context_len, device=query.device)
    outs = []
    for start in range(0, tables.num_tokens, ROWS_PER_CHUNK):
        rows = slice(start, start + ROWS_PER_CHUNK)
        owner = tables.token_to_request[rows]
        visible = mask.visible(tables.positions[rows], key_positions)
        outs.append(attend(query[rows], per_request_key[owner], per_request_value[owner],
                           visible, scale=scale, sinks=sinks))
    return torch.cat(outs) if outs else query.new_empty((0, *query.shape[1:]))


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    tables: BatchTables,
    group: int,
    mask: AttentionMask,
    *,
    context_len: int,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of the step's new tokens (``query [T, Hq, D]``, in ``tables`` order) over
    their sequences in ``kv_cache`` through ``tables.block_tables[group]``. The new tokens'
    K/V must already be written (:func:`write_kv`). ``context_len``: fixed key length, a
    multiple of the block size and at least every sequence's length; keep it the same for
    every step so results are comparable bitwise. Pure; returns ``[T, Hq, D]``."""
    key, value = gather_kv(kv_cache, tables.block_tables[group], context_len)
    return _attend_rows(query, key, value, tables, mask, scale, sinks)


def paged_latent_attention(
    query_latent: torch.Tensor,
    latent_cache: torch.Tensor,
    tables: BatchTables,
    group: int,
    mask: AttentionMask,
    *,
    context_len: int,
    scale: float,
) -> torch.Tensor:
    """MLA attention in latent space: ``query_latent [T, Hq, Dl]`` (queries with the key
    up-projection absorbed) over the gathered latents, which serve as both keys and values;
    returns ``[T, Hq, Dl]`` (apply the value up-projection after). Pure."""
    latent = gather_latent(latent_cache, tables.block_tables[group], context_len)[:, :, None]
    return _attend_rows(query_latent, latent, latent, tables, mask, scale, None)
