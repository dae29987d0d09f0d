"""The warm-versus-cold check behind ``pagedkv check-attention``.

For each layout the same seeded workload runs twice through :class:`~pagedkv.torch.engine.
Engine`: once with prefix caching and shuffled physical placement, once without caching
and with the identity placement. Both runs poison every fresh block with NaN and start
from an all-NaN cache, so a block read before it is written shows up. The logits of every
sampled position are compared with ``torch.equal``: the check passes when every layout has
a prefix hit, every position matches bitwise, and the null block was never written.

Layouts (block size 8, 2 KV heads of size 8, float32; ``max_model_len`` 160):

* ``full``: two full-attention layers (one group, two tensors);
* ``full+sliding``: full + sliding window 20 with attention sinks (two groups sharing one
  tensor);
* ``full+chunked``: full + chunked local attention, chunk 32;
* ``full+mamba``: full + a linear-recurrent state layer whose 128-byte state is padded to
  the 1,024-byte attention page (state checkpoints cached every 8 tokens);
* ``mla``: two MLA-like layers caching one 16-wide latent per token.

Pools are small on purpose: requests get preempted and cached blocks evicted and reused;
the engine also preempts the newest running request every few steps, so recompute after
preemption is exercised in every layout whatever the pool size.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.errors import InvalidArgumentError
from pagedkv.planner import KVCachePlan, plan_kv_cache
from pagedkv.torch._deps import torch
from pagedkv.torch.engine import Engine, EngineStats
from pagedkv.torch.model import TinyDecoder, TinyModelConfig
from pagedkv.torch.tables import Placement, ShuffledPlacement
from pagedkv.torch.tensors import KVCacheTensors

__all__ = [
    "LAYOUTS",
    "Layout",
    "LayoutResult",
    "RunResult",
    "check_layout",
    "compare_runs",
    "layout_named",
    "run_layout",
    "workload",
]

BLOCK_SIZE = 8
MAX_NUM_BATCHED_TOKENS = 40
MAX_NUM_RUNNING = 4
#: Besides preemptions for lack of blocks, the newest running request is preempted before
#: every this-many-th step, so every layout recomputes whatever its pool tuning.
PREEMPT_EVERY_STEPS = 9
_MODEL = TinyModelConfig()


def _attn(cls: type[FullAttentionSpec] | type[SlidingWindowSpec]
          | type[ChunkedLocalAttentionSpec], **extra: int) -> KVCacheSpec:
    return cls(block_size=BLOCK_SIZE, num_kv_heads=_MODEL.num_kv_heads,
               head_size=_MODEL.head_size, dtype_bytes=4, **extra)


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """A named model layout: layer name -> spec in model order, and the pool size (blocks
    beyond one maximal request, so the pool is tight)."""

    name: str
    layers: tuple[tuple[str, KVCacheSpec], ...]
    extra_blocks: int

    def plan(self) -> KVCachePlan:
        """The plan for this layout, ``num_blocks`` = one request's need + ``extra_blocks``."""
        specs = dict(self.layers)
        need = plan_kv_cache(specs, available_bytes=1 << 40, max_model_len=_MODEL.max_model_len,
                             max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                             kernel_block_alignment=BLOCK_SIZE).blocks_per_request + 1
        return plan_kv_cache(specs, available_bytes=1 << 40, max_model_len=_MODEL.max_model_len,
                             max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                             kernel_block_alignment=BLOCK_SIZE,
                             num_blocks=need + self.extra_blocks)


LAYOUTS: tuple[Layout, ...] = (
    Layout(name="full", extra_blocks=2, layers=(
        ("full.0", _attn(FullAttentionSpec)), ("full.1", _attn(FullAttentionSpec)))),
    Layout(name="full+sliding", extra_blocks=2, layers=(
        ("full.0", _attn(FullAttentionSpec)),
        ("sliding.0", _attn(SlidingWindowSpec, sliding_window=20)))),
    Layout(name="full+chunked", extra_blocks=4, layers=(
        ("full.0", _attn(FullAttentionSpec)),
        ("chunked.0", _attn(ChunkedLocalAttentionSpec, attention_chunk_size=32)))),
    Layout(name="full+mamba", extra_blocks=2, layers=(
        ("full.0", _attn(FullAttentionSpec)),
        ("mamba.0", MambaSpec(block_size=BLOCK_SIZE, state_bytes=_MODEL.state_size * 4,
                              cache_checkpoints=True)))),
    Layout(name="mla", extra_blocks=2, layers=(
        ("mla.0", MLAAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1,
                                   head_size=_MODEL.latent_size, dtype_bytes=4)),
        ("mla.1", MLAAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1,
                                   head_size=_MODEL.latent_size, dtype_bytes=4)))),
)


def workload(seed: int = 0) -> list[tuple[str, list[int], int]]:
    """``(request_id, prompt, max_new_tokens)``: 14 requests over three shared prefixes
    (24-56 tokens) with 3-30-token suffixes, two exact repeats. Deterministic in ``seed``."""
    rng = random.Random(seed)
    vocab = _MODEL.vocab_size
    prefixes = [[rng.randrange(vocab) for _ in range(n)] for n in (40, 56, 24)]
    out = []
    for i in range(12):
        prefix = prefixes[i % 3]
        suffix = [rng.randrange(vocab) for _ in range(rng.randint(3, 30))]
        out.append((f"req-{i}", prefix + suffix, rng.randint(3, 8)))
    out.append(("req-12", list(out[1][1]), 5))
    out.append(("req-13", list(out[5][1]), 4))
    return out


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class RunResult:
    """One engine run: sampled logits by ``(request_id, position)``, generated tokens,
    counters, evicted cached blocks, and whether the null block kept its initial bytes."""

    logits: dict[tuple[str, int], torch.Tensor]
    outputs: dict[str, list[int]]
    stats: EngineStats
    num_evicted_blocks: int
    null_block_untouched: bool


def run_layout(
    layout: Layout,
    *,
    enable_caching: bool,
    device: torch.device | str = "cpu",
    placement: Callable[[int], Placement] | None = None,
    poison_value: float | None = float("nan"),
    requests: Sequence[tuple[str, list[int], int]] | None = None,
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
) -> RunResult:
    """Run ``requests`` (default :func:`workload`) through a fresh cache and manager.
    ``placement(num_blocks)`` builds the placement (default: the identity)."""
    plan = layout.plan()
    fill = poison_value if poison_value is not None else 0.0
    cache = KVCacheTensors(plan, dtype=torch.float32, device=device, fill=fill)
    null_before = cache.block_bytes(0)
    manager = KVCacheManager(CacheConfig(
        groups=tuple(g.spec for g in plan.groups), num_blocks=plan.num_blocks,
        max_model_len=_MODEL.max_model_len, enable_caching=enable_caching))
    model = TinyDecoder(_MODEL, cache, [name for name, _ in layout.layers])
    engine = Engine(manager, model, cache, max_num_batched_tokens=max_num_batched_tokens,
                    max_num_running=MAX_NUM_RUNNING,
                    placement=placement(plan.num_blocks) if placement else None,
                    poison_value=poison_value, preempt_every_steps=PREEMPT_EVERY_STEPS)
    for rid, prompt, max_new in requests if requests is not None else workload():
        engine.add_request(rid, prompt, max_new)
    engine.run()
    return RunResult(logits=engine.logits, outputs=engine.finished, stats=engine.stats,
                     num_evicted_blocks=manager.num_evicted_blocks,
                     null_block_untouched=cache.block_bytes(0) == null_before)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutResult:
    """Cached versus uncached run of one layout."""

    layout: str
    hit_tokens: int
    computed_tokens_cached: int
    computed_tokens_uncached: int
    preemptions: int
    evicted_blocks: int
    compared_positions: int
    max_abs_diff: float
    bitwise_equal: bool
    null_block_untouched: bool

    @property
    def ok(self) -> bool:
        """Bitwise equal, a non-vacuous hit, and the null block never written."""
        return self.bitwise_equal and self.hit_tokens > 0 and self.null_block_untouched


def compare_runs(layout: str, cached: RunResult, cold: RunResult) -> LayoutResult:
    """Compare the sampled logits of two runs position by position (``torch.equal``); the
    maximum absolute difference is NaN-aware (a NaN on one side counts as infinite)."""
    keys = sorted(set(cached.logits) | set(cold.logits))
    equal = set(cached.logits) == set(cold.logits)
    max_diff = 0.0
    for key in keys:
        a, b = cached.logits.get(key), cold.logits.get(key)
        if a is None or b is None:
            max_diff = float("inf")
            continue
        if not torch.equal(a, b):
            equal = False
            diff = (a.double() - b.double()).abs()
            worst = float("inf") if bool(torch.isnan(diff).any()) else float(diff.max())
            max_diff = max(max_diff, worst)
    return LayoutResult(
        layout=layout, hit_tokens=cached.stats.hit_tokens,
        computed_tokens_cached=cached.stats.computed_tokens,
        computed_tokens_uncached=cold.stats.computed_tokens,
        preemptions=cached.stats.preemptions, evicted_blocks=cached.num_evicted_blocks,
        compared_positions=len(keys), max_abs_diff=max_diff, bitwise_equal=equal,
        null_block_untouched=cached.null_block_untouched and cold.null_block_untouched,
    )


def check_layout(layout: Layout, *, device: torch.device | str = "cpu",
                 seed: int = 1) -> LayoutResult:
    """Cached run (shuffled placement, ``seed``) against an uncached run (identity
    placement), both NaN-poisoned."""
    cached = run_layout(layout, enable_caching=True, device=device,
                        placement=lambda n: ShuffledPlacement(num_blocks=n, seed=seed))
    cold = run_layout(layout, enable_caching=False, device=device)
    return compare_runs(layout.name, cached, cold)


def layout_named(name: str) -> Layout:
    """Raises:
        InvalidArgumentError: no layout of that name."""
    for layout in LAYOUTS:
        if layout.name == name:
            return layout
    raise InvalidArgumentError(
        f"unknown layout {name!r}; choose from {[lay.name for lay in LAYOUTS]}")
