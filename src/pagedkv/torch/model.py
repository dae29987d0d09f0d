"""A tiny randomly initialised decoder whose layers read and write the paged KV cache.

It exists to check block tables end to end: its mixers are chosen by the layer's spec
class (full / sliding window with sinks / chunked local attention, MLA-like latent
attention, a linear-recurrent "Mamba-like" mixer), every weight comes from one seed, and
every operation is row-wise with a fixed row length (linears are products summed along the
last dimension, not matrix multiplies whose reduction order can depend on the batch shape).
So a token's logits depend only on the tokens before it, never on batching, on the
physical placement of its blocks, or on whether its prefix came from the cache.

Block layout: see :mod:`pagedkv.torch.tensors`. The state mixer's coupling to the state
group's block table is in :func:`checkpoint_state_io` and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.errors import InvalidArgumentError
from pagedkv.torch._deps import torch
from pagedkv.torch.attention import (
    AttentionMask,
    CausalMask,
    ChunkedLocalMask,
    SlidingWindowMask,
    paged_attention,
    paged_latent_attention,
    write_kv,
    write_latent,
)
from pagedkv.torch.tables import BatchTables
from pagedkv.torch.tensors import KVCacheTensors

__all__ = ["TinyDecoder", "TinyModelConfig", "checkpoint_state_io", "linear"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TinyModelConfig:
    """Sizes of the tiny decoder. ``max_model_len`` is also the fixed key length every
    attention call gathers (a multiple of every block size)."""

    vocab_size: int = 96
    hidden_size: int = 32
    num_heads: int = 4
    num_kv_heads: int = 2
    head_size: int = 8
    mlp_size: int = 64
    latent_size: int = 16
    state_size: int = 32
    max_model_len: int = 160
    seed: int = 0


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [T, in]`` times ``weight [out, in]`` transposed, as a product summed along the
    contiguous last dimension: each output element's reduction order is fixed by ``in``
    alone, whatever ``T`` is. Pure."""
    out: torch.Tensor = (x[:, None, :] * weight[None, :, :]).sum(-1)
    return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    mean_square = (x * x).sum(-1, keepdim=True) / x.shape[-1]
    return x / torch.sqrt(mean_square + 1e-6) * weight


def checkpoint_state_io(
    num_computed_tokens: int, num_new_tokens: int, block_size: int
) -> tuple[int | None, list[tuple[int, int]]]:
    """Where a state mixer reads and writes its state in the state group's block table,
    for today's checkpoint layout (``MambaSpec(cache_checkpoints=True)``): column ``j``
    holds the state after ``min((j + 1) * block_size, computed)`` tokens.

    Returns ``(read_column, writes)``: the column holding the state after
    ``num_computed_tokens`` (``None``: start from zeros), and ``(tokens_done, column)``
    pairs: after the first ``tokens_done`` new tokens, store the state in ``column``.

    Worked cases (block size 8): 0 computed, 20 new -> read None, writes (8, 0), (16, 1),
    (20, 2). 16 computed (a hit of two checkpoints), 1 new -> read 1, write (1, 2).
    13 computed, 3 new -> read 1, writes (3, 1).
    """
    read = None if num_computed_tokens == 0 else -(-num_computed_tokens // block_size) - 1
    end = num_computed_tokens + num_new_tokens
    writes = [
        (boundary - num_computed_tokens, boundary // block_size - 1)
        for boundary in range((num_computed_tokens // block_size + 1) * block_size, end + 1,
                              block_size)
    ]
    if end % block_size:
        writes.append((num_new_tokens, end // block_size))
    return read, writes


class _Mixer:
    """The token-mixing half of a decoder layer; ``forward`` reads and writes the cache."""

    def __init__(self, name: str, group: int, cfg: TinyModelConfig, gen: torch.Generator,
                 device: torch.device) -> None:
        self.name = name
        self.group = group
        self.cfg = cfg
        self.gen = gen
        self.device = device

    def weight(self, *shape: int) -> torch.Tensor:
        fan_in = shape[-1]
        w: torch.Tensor = torch.randn(*shape, generator=self.gen) / float(fan_in) ** 0.5
        return w.to(self.device)

    def forward(self, x: torch.Tensor, tables: BatchTables) -> torch.Tensor:
        raise NotImplementedError


class _AttentionMixer(_Mixer):
    def __init__(self, name: str, group: int, cfg: TinyModelConfig, gen: torch.Generator,
                 device: torch.device, cache: torch.Tensor, mask: AttentionMask,
                 with_sinks: bool) -> None:
        super().__init__(name, group, cfg, gen, device)
        h, hq, hkv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_size
        self.cache, self.mask = cache, mask
        self.wq, self.wk, self.wv = self.weight(hq * d, h), self.weight(hkv * d, h), \
            self.weight(hkv * d, h)
        self.wo = self.weight(h, hq * d)
        self.sinks = self.weight(hq, 1)[:, 0] if with_sinks else None

    def forward(self, x: torch.Tensor, tables: BatchTables) -> torch.Tensor:
        cfg, num_tokens = self.cfg, x.shape[0]
        slots = tables.slot_mappings[self.group]
        assert slots is not None
        q = linear(x, self.wq).view(num_tokens, cfg.num_heads, cfg.head_size)
        k = linear(x, self.wk).view(num_tokens, cfg.num_kv_heads, cfg.head_size)
        v = linear(x, self.wv).view(num_tokens, cfg.num_kv_heads, cfg.head_size)
        write_kv(self.cache, slots, k, v)
        out = paged_attention(q, self.cache, tables, self.group, self.mask,
                              context_len=cfg.max_model_len, scale=cfg.head_size**-0.5,
                              sinks=self.sinks)
        return linear(out.reshape(num_tokens, -1), self.wo)


class _LatentAttentionMixer(_Mixer):
    """MLA-like: one latent per token is cached; queries absorb the key up-projection."""

    def __init__(self, name: str, group: int, cfg: TinyModelConfig, gen: torch.Generator,
                 device: torch.device, cache: torch.Tensor) -> None:
        super().__init__(name, group, cfg, gen, device)
        h, hq, d, lat = cfg.hidden_size, cfg.num_heads, cfg.head_size, cache.shape[-1]
        self.cache = cache
        self.wq, self.wdkv = self.weight(hq * d, h), self.weight(lat, h)
        self.wuk, self.wuv = self.weight(hq, lat, d), self.weight(hq, d, lat)
        self.wo = self.weight(h, hq * d)

    def forward(self, x: torch.Tensor, tables: BatchTables) -> torch.Tensor:
        cfg, num_tokens = self.cfg, x.shape[0]
        slots = tables.slot_mappings[self.group]
        assert slots is not None
        write_latent(self.cache, slots, linear(x, self.wdkv))
        q = linear(x, self.wq).view(num_tokens, cfg.num_heads, 1, cfg.head_size)
        q_latent = (q * self.wuk[None]).sum(-1)  # [T, Hq, latent]
        out_latent = paged_latent_attention(
            q_latent, self.cache, tables, self.group, CausalMask(),
            context_len=cfg.max_model_len, scale=cfg.head_size**-0.5)
        out = (out_latent[:, :, None, :] * self.wuv[None]).sum(-1)  # [T, Hq, D]
        return linear(out.reshape(num_tokens, -1), self.wo)


class _RecurrentMixer(_Mixer):
    """Mamba-like: ``s_t = a * s_{t-1} + W_in x_t`` per channel, output ``W_out s_t``; the
    state lives in the state group's blocks (:func:`checkpoint_state_io`)."""

    def __init__(self, name: str, group: int, cfg: TinyModelConfig, gen: torch.Generator,
                 device: torch.device, states: torch.Tensor, block_size: int) -> None:
        super().__init__(name, group, cfg, gen, device)
        size = cfg.state_size
        if states.shape[1] != size:
            raise InvalidArgumentError(
                f"layer {name!r}: state pages hold {states.shape[1]} elements, the model's "
                f"state_size is {size}; plan MambaSpec(state_bytes=state_size x itemsize)"
            )
        self.states, self.block_size = states, block_size
        self.w_in, self.w_out = self.weight(size, cfg.hidden_size), self.weight(cfg.hidden_size,
                                                                                   size)
        self.decay = torch.sigmoid(self.weight(size, 1)[:, 0] * 4.0)

    def forward(self, x: torch.Tensor, tables: BatchTables) -> torch.Tensor:
        u = linear(x, self.w_in)
        ys = torch.empty_like(u)
        table = tables.block_tables[self.group]
        starts = tables.query_start_loc.tolist()
        computed = tables.num_computed_tokens.tolist()
        for r, (c, begin, end) in enumerate(zip(computed, starts, starts[1:], strict=False)):
            read, writes = checkpoint_state_io(c, end - begin, self.block_size)
            if read is None:
                state = torch.zeros_like(self.decay)
            else:
                block = table[r, read]
                assert int(block) != 0, f"{self.name}: live state in the null block"
                state = self.states[block].clone()
            done = 0
            for tokens_done, column in writes:
                for i in range(begin + done, begin + tokens_done):
                    state = self.decay * state + u[i]
                    ys[i] = state
                done = tokens_done
                block = table[r, column]
                assert int(block) != 0, f"{self.name}: state write into the null block"
                self.states[block] = state
        return linear(ys, self.w_out)


class TinyDecoder:
    """Embedding (token + learned position) -> layers (pre-norm mixer + ReLU MLP, residual)
    -> final norm -> logits. Layers follow ``cache.plan``'s layer order as given by
    ``layer_names``; the mixer is chosen by the layer's spec class.

    Raises:
        InvalidArgumentError: a layer kind the tiny model has no mixer for, or sizes that do
            not match the plan.
    """

    def __init__(self, cfg: TinyModelConfig, cache: KVCacheTensors,
                 layer_names: list[str] | None = None) -> None:
        self.cfg = cfg
        self.cache = cache
        device = cache.device
        gen = torch.Generator().manual_seed(cfg.seed)
        self.embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen).to(device)
        self.pos_embed = (torch.randn(cfg.max_model_len, cfg.hidden_size, generator=gen)
                          * 0.5).to(device)
        names = layer_names or list(cache.layer_to_spec)
        self.mixers: list[_Mixer] = []
        self.mlps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for name in names:
            self.mixers.append(self._mixer(name, cache.spec(name), gen, device))
            last = self.mixers[-1]
            self.mlps.append((
                torch.ones(cfg.hidden_size, device=device),
                torch.ones(cfg.hidden_size, device=device),
                last.weight(cfg.mlp_size, cfg.hidden_size),
                last.weight(cfg.hidden_size, cfg.mlp_size),
            ))
        self.final_norm = torch.ones(cfg.hidden_size, device=device)
        self.lm_head = (torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
                        / cfg.hidden_size**0.5).to(device)

    def _mixer(self, name: str, spec: KVCacheSpec, gen: torch.Generator,
               device: torch.device) -> _Mixer:
        cfg, group = self.cfg, self.cache.layer_to_group[name]
        if isinstance(spec, MambaSpec):
            return _RecurrentMixer(name, group, cfg, gen, device, self.cache.state(name),
                                   spec.block_size)
        if isinstance(spec, MLAAttentionSpec):
            return _LatentAttentionMixer(name, group, cfg, gen, device, self.cache.latent(name))
        if not isinstance(spec, FullAttentionSpec | SlidingWindowSpec
                          | ChunkedLocalAttentionSpec) or (
            spec.num_kv_heads, spec.head_size) != (cfg.num_kv_heads, cfg.head_size):
            raise InvalidArgumentError(
                f"layer {name!r}: the tiny model has no mixer for {spec.describe()}")
        if cfg.max_model_len % spec.block_size:
            raise InvalidArgumentError(
                f"max_model_len {cfg.max_model_len} is not a multiple of block size "
                f"{spec.block_size}")
        mask: AttentionMask
        if isinstance(spec, SlidingWindowSpec):
            mask = SlidingWindowMask(spec.sliding_window)
        elif isinstance(spec, ChunkedLocalAttentionSpec):
            mask = ChunkedLocalMask(spec.attention_chunk_size)
        elif isinstance(spec, FullAttentionSpec):
            mask = CausalMask()
        else:
            raise InvalidArgumentError(
                f"layer {name!r}: the tiny model has no mixer for {spec.describe()}")
        return _AttentionMixer(name, group, cfg, gen, device, self.cache.kv(name), mask,
                               with_sinks=isinstance(spec, SlidingWindowSpec))

    def forward(self, token_ids: torch.Tensor, tables: BatchTables,
                logit_rows: torch.Tensor) -> torch.Tensor:
        """Run the step's new tokens (``token_ids [T]`` in ``tables`` order) through every
        layer, writing their K/V and states into the cache; returns the logits
        ``[R, vocab]`` of the rows ``logit_rows [R]``. Mutates the cache at the step's
        slots and state blocks only."""
        x = self.embed[token_ids] + self.pos_embed[tables.positions]
        for mixer, (norm1, norm2, w_up, w_down) in zip(self.mixers, self.mlps, strict=True):
            x = x + mixer.forward(_rms_norm(x, norm1), tables)
            x = x + linear(torch.relu(linear(_rms_norm(x, norm2), w_up)), w_down)
        return linear(_rms_norm(x[logit_rows], self.final_norm), self.lm_head)
