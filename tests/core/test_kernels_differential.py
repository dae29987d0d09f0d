"""The compiled core against the pure-Python core on every layout, side by side.

One Hypothesis state machine (:class:`Differential`) builds the same manager twice in one
process -- the compiled core's and, inside :func:`pagedkv.core.native.forced_pure`, the pure
core's -- and makes every call on both: new requests over shared prefixes, lookups
(``get_computed_blocks``, ``lookup_prefix`` with and without a bound, the host tier's
``lookup``), first allocations with hits, chunked prefill, external tokens, lookahead
slots, ``full_sequence_must_fit``, ``delay_caching`` then ``cache_blocks``, decode
steps, the engine's counting keywords (``num_in_flight_tokens``, ``lenient_counts``),
frees, deferred frees (``pop_blocks_for_free`` / ``release_blocks``), preemption (free,
then re-admitted with ``num_preemptions`` counted), ``new_step_starts``,
``reset_prefix_cache``, ``evict_blocks`` and queries, on a pool small enough that
allocations evict and get refused. Every return value (or raised error, type and message)
must be equal, and after every step ``debug_state()`` must be equal and
``check_invariants()`` pass on both.

:data:`LAYOUTS` lists the layouts, one test each; :data:`EXAMPLES` and :data:`STEPS` the
example count and steps per example every layout runs (also in the test ids). Under
``PAGEDKV_PURE=1`` both managers would be pure, so the module skips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedkv import (
    CacheConfig,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheManager,
    MambaSpec,
    MLAAttentionSpec,
    Request,
    SlidingWindowSpec,
)
from pagedkv.core import native
from pagedkv.core.coordinator_base import ComputedBlocks
from pagedkv.core.kernels import PURE
from pagedkv.host import HostTierConfig, TieredHit
from pagedkv.retention import RequestRetention, RetentionConfig, TokenRangeRetention

pytestmark = pytest.mark.skipif(
    native.active() is None,
    reason=f"compares the compiled core with the pure one; the compiled core is not in use "
           f"({native.IMPORT_ERROR})")

#: Examples per layout, and steps per example (each layout is one test).
EXAMPLES = 60
STEPS = 50
MAX_MODEL_LEN = 64
HEADS = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}




class Clock:
    """A clock both retention managers read; the machine moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def full(bs: int = 4) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, **HEADS)


def window(bs: int = 4, tokens: int = 8) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size=bs, sliding_window=tokens, **HEADS)


def chunked(bs: int = 4, chunk: int = 8) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(block_size=bs, attention_chunk_size=chunk, **HEADS)


def mamba(bs: int = 4) -> MambaSpec:
    return MambaSpec(block_size=bs, state_bytes=64)  # vLLM's mamba_cache_mode="align"


def mla(bs: int = 4) -> MLAAttentionSpec:
    return MLAAttentionSpec(block_size=bs, num_kv_heads=1, head_size=16, dtype_bytes=2)


@dataclass(frozen=True)
class Layout:
    """One manager configuration; ``config(clock)`` builds its CacheConfig."""

    groups: tuple[Any, ...]
    num_blocks: int
    retention: bool = False
    host: bool = False

    def config(self, clock: Clock) -> CacheConfig:
        return CacheConfig(
            groups=self.groups, num_blocks=self.num_blocks, max_model_len=MAX_MODEL_LEN,
            hash_memo_blocks=8, enable_events=True,
            retention=RetentionConfig(clock=clock, pin_budget_fraction=0.3)
            if self.retention else None,
            host_tier=HostTierConfig(num_blocks=12) if self.host else None)


LAYOUTS: dict[str, Layout] = {
    "full": Layout((full(),), 14),
    "sliding_window": Layout((window(),), 12),
    "chunked_local": Layout((chunked(),), 12),
    "mamba_align": Layout((mamba(),), 10),
    "full_swa_mamba": Layout((full(), window(), mamba()), 30),
    "mixed_full8_swa4": Layout((full(8), window(4, 12)), 16),
    "mla": Layout((mla(),), 14),
    "full_retention": Layout((full(),), 14, retention=True),
    "full_swa_retention": Layout((full(), window()), 24, retention=True),
    "full_host": Layout((full(),), 12, host=True),
    "full_swa_mamba_host": Layout((full(), window(), mamba()), 30, host=True),
    "full_chunked": Layout((full(), chunked()), 24),
    "full_mamba_align": Layout((full(), mamba()), 24),
}

#: Keyword sets of a running request's odd step (:meth:`Differential.odd_step`): those
#: the compiled entry points take, then odd ones they hand to the Python method (which
#: validates and raises, or takes the general path).
STEP_KEYWORDS: list[dict[str, Any]] = [
    {}, {"num_lookahead_tokens": 2}, {"reserved_blocks": 2}, {"delay_caching": True},
    {"has_scheduled_reqs": False, "full_sequence_must_fit": False},
    {"new_computed_blocks": None, "num_external_computed_tokens": 0,
     "num_encoder_tokens": 0, "num_new_computed_tokens": None},
    {"num_in_flight_tokens": 1, "lenient_counts": True},
    {"num_in_flight_tokens": 0, "lenient_counts": False, "delay_caching": False},
    {"num_lookahead_tokens": -1}, {"reserved_blocks": True}, {"lenient_counts": 1},
    {"num_in_flight_tokens": 10**6}, {"full_sequence_must_fit": True},
    {"num_external_computed_tokens": 2}, {"delay_caching": 1}, {"unknown": 0},
]

#: Shared prefixes: two block-aligned, one ending inside a block (with ids past the plain
#: hash kernel's table: the checked hashing path), one empty.
PREFIXES = [[1000 + i for i in range(16)], [2000 + i for i in range(10)],
            [7, 7, 7, (1 << 17) + 1, 7, 7, 7, 7, 7], []]


def view(value: Any) -> Any:
    """What two managers' answers are compared on: a hit without its issuer (each
    manager stamps its own), anything else as it is."""
    if isinstance(value, ComputedBlocks):
        return value._replace(issuer=None)
    if isinstance(value, TieredHit):
        return ("tiered", view(value.device), value.host)
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(view(v) for v in value)
    return value


Pair = tuple[Request, Request]


@contextmanager
def computed_as(pair: Pair, count: Any) -> Iterator[None]:
    """Both requests' ``num_computed_tokens`` set to ``count`` (left as they are when
    ``None``) inside the block, and restored after it, also when the call inside raises."""
    saved = pair[0].num_computed_tokens
    if count is not None:
        for req in pair:
            req.num_computed_tokens = count
    try:
        yield
    finally:
        for req in pair:
            req.num_computed_tokens = saved


class Differential(RuleBasedStateMachine):
    """Every call on the compiled-core and the pure-core manager; answers and state equal."""

    layout: Layout

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        compiled = KVCacheManager(self.layout.config(self.clock))
        with native.forced_pure():
            pure = KVCacheManager(self.layout.config(self.clock))
        assert compiled.hasher._plain is not PURE.hash_plain
        assert pure.hasher._plain is PURE.hash_plain
        self.mgrs = (compiled, pure)
        self.waiting: list[Pair] = []
        self.running: list[Pair] = []
        self.held: list[list[int]] = []
        self.counter = 0
        self.prompts: list[list[int]] = []
        self.has_mamba = any(isinstance(g, MambaSpec) for g in self.layout.groups)

    def both(self, call: Callable[[KVCacheManager, int], Any]) -> Any:
        """``call(manager, index)`` on both; the answers (or errors) must be equal.
        Returns the compiled manager's answer (None after an error)."""
        return self.both_raw(call)[0]

    def both_raw(self, call: Callable[[KVCacheManager, int], Any]) -> list[Any]:
        """:meth:`both`, returning each manager's own answer."""
        raw: list[Any] = []
        seen = []
        for k, mgr in enumerate(self.mgrs):
            try:
                raw.append(call(mgr, k))
                seen.append(("ok", view(raw[-1])))
            except Exception as exc:  # compared, not swallowed
                raw.append(None)
                seen.append(("error", (type(exc), str(exc))))
        assert seen[0] == seen[1], seen
        return raw

    def settle_host(self, ok: bool = True) -> None:
        """A host tier's step: every store and load plan taken (equal on both) and
        completed with ``ok``."""
        if not self.layout.host:
            return
        plans = self.both_raw(lambda m, k: (m.host.take_store_plans(),
                                            m.host.take_load_plans()))
        for m, (stores, loads) in zip(self.mgrs, plans, strict=True):
            for p in stores:
                m.host.complete_store(p, ok)
            for p in loads:
                m.host.complete_load(p, ok)

    @rule(prefix=st.sampled_from(range(len(PREFIXES))),
          suffix=st.lists(st.integers(0, 300), min_size=1, max_size=20),
          keep=st.sampled_from([None, 0, 90]), admit=st.booleans(),
          again=st.sampled_from([None, None, 0, 1, 2]))
    def new_request(self, prefix: int, suffix: list[int], keep: int | None,
                    admit: bool, again: int | None) -> None:
        """A request over a shared prefix, or ``again`` an earlier request's whole prompt
        (the ``again``-th last) extended by a part of ``suffix`` (``keep``: a retention
        priority for half its prompt, retention layouts only), admitted at once
        (``admit``) or left waiting."""
        self.counter += 1
        rid = f"r{self.counter}"
        tokens = PREFIXES[prefix] + suffix
        if again is not None and again < len(self.prompts):
            tokens = self.prompts[-1 - again] + suffix[: len(suffix) // 2]
        tokens = tokens[: MAX_MODEL_LEN - 8]
        self.prompts.append(tokens)
        kw: dict[str, Any] = {}
        if self.layout.retention and keep is not None:
            kw["retention"] = RequestRetention(ranges=(TokenRangeRetention(
                token_end=len(tokens) // 2 or None, priority=keep, duration_s=5.0),))
        reqs = [m.new_request(rid, tokens, **kw) for m in self.mgrs]
        assert reqs[0].block_hashes == reqs[1].block_hashes
        self.waiting.append((reqs[0], reqs[1]))
        if admit:
            self.admit(len(self.waiting) - 1, "host" if self.layout.host else "get", 0,
                       None, 0, 0, delay=False, must_fit=False)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100), how=st.sampled_from(["get", "prefix", "bounded", "host"]),
          bound=st.integers(0, 40), chunk=st.sampled_from([None, 1, 3, 8]),
          external=st.integers(0, 5), lookahead=st.sampled_from([0, 0, 2, 7]),
          delay=st.booleans(), must_fit=st.booleans())
    def admit(self, i: int, how: str, bound: int, chunk: int | None, external: int,
              lookahead: int, delay: bool, must_fit: bool) -> None:
        """A waiting request's lookup and first allocation (a chunk of its prompt, or all
        of it), with external tokens, lookahead and the admission gate as drawn."""
        pair = self.waiting[i % len(self.waiting)]
        if how == "host" and not self.layout.host:
            how = "get"

        def look(m: KVCacheManager, k: int) -> Any:
            if how == "get":
                return m.get_computed_blocks(pair[k])
            if how == "host":
                return m.host.lookup(pair[k])
            return m.lookup_prefix(pair[k], bound if how == "bounded" else None)

        hits = self.both_raw(look)
        if hits[0] is not None:
            self.admit_with(pair, hits, chunk, external, lookahead, delay, must_fit)

    def admit_with(self, pair: Pair, hits: list[Any], chunk: int | None, external: int,
                   lookahead: int, delay: bool, must_fit: bool) -> None:
        computed = pair[0].num_computed_tokens + hits[0].num_computed_tokens
        left = pair[0].num_tokens - computed
        external = min(external, left - 1)
        n_new = left - external if chunk is None else max(1, min(chunk, left - external))
        new = self.both(lambda m, k: m.allocate_slots(
            pair[k], n_new, new_computed_blocks=hits[k], num_lookahead_tokens=lookahead,
            num_external_computed_tokens=external, delay_caching=delay,
            full_sequence_must_fit=must_fit))
        self.settle_host()
        if new is not None:
            for req in pair:
                req.num_computed_tokens = computed + external + n_new
            self.waiting.remove(pair)
            self.running.append(pair)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), tokens=st.lists(st.integers(0, 1 << 18), min_size=1,
                                                 max_size=6),
          chunk=st.sampled_from([1, 4, 9]), lookahead=st.sampled_from([0, 0, 3]))
    def step(self, i: int, tokens: list[int], chunk: int, lookahead: int) -> None:
        """The next chunk of a prefill, or decode tokens (the plain per-step call)."""
        pair = self.running[i % len(self.running)]
        left = pair[0].num_tokens - pair[0].num_computed_tokens
        if left > 0:
            n = min(chunk, left)
        elif pair[0].num_tokens + len(tokens) <= MAX_MODEL_LEN:
            for req in pair:
                req.append_output_tokens(tokens)
            assert pair[0].block_hashes == pair[1].block_hashes
            n = len(tokens)
        else:
            return
        if lookahead:
            self.both(lambda m, k: m.allocate_slots(pair[k], n, num_lookahead_tokens=lookahead))
        else:
            self.both(lambda m, k: m.allocate_slots(pair[k], n))
        for req in pair:
            req.num_computed_tokens += n
        self.settle_host()

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.integers(1, 6), delta=st.integers(-2, 2),
          in_flight=st.sampled_from([None, 0, 1, 2, 100, True]),
          lenient=st.sampled_from([None, True, False]))
    def engine_step(self, i: int, n: int, delta: int, in_flight: Any, lenient: Any) -> None:
        """An engine's counting (vLLM 0.33's async scheduling): tokens in flight counted
        as computed, new tokens past the request's; out-of-range values raise alike."""
        pair = self.running[i % len(self.running)]
        kwargs: dict[str, Any] = {}
        if in_flight is not None:
            kwargs["num_in_flight_tokens"] = in_flight
        if lenient is not None:
            kwargs["lenient_counts"] = lenient
        with computed_as(pair, max(0, pair[0].num_tokens + delta)):
            self.both(lambda m, k: m.allocate_slots(pair[k], n, **kwargs))
        self.settle_host()

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.sampled_from([0, -1, 1, 2, 10**9, True, 1.0, None]),
          computed=st.sampled_from([None, -1, 0, 1, 10**9, 1.5, "x"]),
          kw=st.sampled_from(range(len(STEP_KEYWORDS))))
    def odd_step(self, i: int, n: Any, computed: Any, kw: int) -> None:
        """``allocate_slots`` with counts, computed counts and keyword sets that the
        compiled entry points must hand to the Python method (which raises the documented
        error) or take themselves; the request's computed count restored after. Odd
        computed counts and the counting keywords are left out here with a Mamba group:
        under ``lenient_counts`` an odd count (10**9 tokens) makes the Mamba align group
        walk its table one entry per block up to that count, on both cores alike (an open
        question for the Mamba manager; the plain counting keywords run in
        ``engine_step`` on every layout)."""
        pair = self.running[i % len(self.running)]
        kwargs = STEP_KEYWORDS[kw]
        if self.has_mamba and ({"num_in_flight_tokens", "lenient_counts"} & set(kwargs)):
            kwargs = {}
        with computed_as(pair, None if self.has_mamba else computed):
            self.both(lambda m, k: m.allocate_slots(pair[k], n, **kwargs))
        self.settle_host()

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.sampled_from([0, 1, 4, 9, 15, 16, 17, 33, 64, 10**9,
                                                     -1, True, 2.0, None]))
    def cache_blocks(self, i: int, n: Any) -> None:
        pair = self.running[i % len(self.running)]
        self.both(lambda m, k: m.cache_blocks(pair[k], n))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), how=st.sampled_from(["free", "preempt", "pop"]))
    def finish(self, i: int, how: str) -> None:
        """Free (finished), preempt (free, then waiting again to be re-admitted), or a
        deferred free whose blocks are released later (tail first)."""
        pair = self.running.pop(i % len(self.running))
        if how == "pop":
            self.held.append(self.both(lambda m, k: m.pop_blocks_for_free(pair[k])))
        else:
            self.both(lambda m, k: m.free(pair[k]))
        if how == "preempt":
            for req in pair:
                req.num_computed_tokens = 0
                req.num_preemptions += 1
            self.waiting.append(pair)
        self.settle_host()

    @precondition(lambda self: self.held)
    @rule()
    def release(self) -> None:
        blocks = self.held.pop(0)
        self.both(lambda m, k: m.release_blocks(list(reversed(blocks))))

    @rule(ok=st.booleans(), seconds=st.sampled_from([0.0, 1.0, 10.0]))
    def new_step(self, ok: bool, seconds: float) -> None:
        """A scheduler step begins (time passes for retention; host plans complete)."""
        self.clock.now += seconds
        self.both(lambda m, k: m.new_step_starts())
        self.settle_host(ok)
        self.both(lambda m, k: (m.take_new_block_ids(), m.take_block_copies(),
                                m.take_events()))

    @rule(ids=st.lists(st.integers(0, 31), min_size=1, max_size=3))
    def evict(self, ids: list[int]) -> None:
        self.both(lambda m, k: m.evict_blocks(ids))

    @rule(dice=st.integers(0, 7))
    def reset(self, dice: int) -> None:
        """``reset_prefix_cache`` (one draw in eight: it empties the cache)."""
        if dice == 0:
            self.both(lambda m, k: m.reset_prefix_cache())

    @precondition(lambda self: self.layout.retention and self.running)
    @rule(i=st.integers(0, 100), ttl=st.sampled_from([1.0, 30.0]))
    def pin(self, i: int, ttl: float) -> None:
        pair = self.running[i % len(self.running)]
        self.both(lambda m, k: m.retention.pin_prefix(pair[k], ttl_s=ttl).keys)

    @rule(i=st.integers(0, 100))
    def queries(self, i: int) -> None:
        self.both(lambda m, k: (m.num_free_blocks, m.usage, m.num_evicted_blocks,
                                m.make_prefix_cache_stats()))
        if self.running:
            pair = self.running[i % len(self.running)]
            self.both(lambda m, k: (m.get_block_ids(pair[k].request_id),
                                    m.get_num_cached_blocks(pair[k].request_id),
                                    m.estimate_cached_tokens(pair[k])))

    @invariant()
    def same_state(self) -> None:
        assert self.mgrs[0].debug_state() == self.mgrs[1].debug_state()
        for mgr in self.mgrs:
            mgr.check_invariants()


def machine_for(name: str) -> type[Differential]:
    return type(f"Differential_{name}", (Differential,), {"layout": LAYOUTS[name]})


@pytest.mark.parametrize("name", [pytest.param(n, id=f"{n}-{EXAMPLES}x{STEPS}")
                                  for n in LAYOUTS])
def test_compiled_equals_pure(name: str) -> None:
    case = machine_for(name).TestCase
    case.settings = settings(max_examples=EXAMPLES, stateful_step_count=STEPS,
                             deadline=None, suppress_health_check=list(HealthCheck))
    case("runTest").runTest()
