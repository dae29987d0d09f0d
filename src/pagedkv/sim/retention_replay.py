"""Retention policies for the simulator, and a pure-cache replay that applies them.

A :class:`SimRetentionPolicy` says how a manager is configured (``config``) and what each
request asks for once served (``after_request``: its ``RequestRetention``, pins). The
replay (:func:`replay_pure_cache`) is the simulator's pure-cache mode (lookup, compute the
whole prompt, free; see :mod:`pagedkv.sim.pure_cache`) with the policy's hooks and the
clock set to each request's arrival time, so hit rates compare directly with the
simulator's LRU figure and its Belady bound.

Policies (all online: none looks at future requests):

* :class:`LRU` — no retention (vLLM's eviction).
* :class:`PinPopularPrefixes` — a request's leading blocks that an earlier request also
  carried (a shared system prompt) are pinned for ``ttl_s`` simulated seconds, renewed by
  every hit, within the pin budget (refused pins are skipped).
* :class:`PopularityPriority` — blocks are freed at a priority growing with the number of
  requests that carried them (popular prefixes outlive one-off content).
* :class:`TenantQuota` — listed tenants (``tenant_of(request)``) keep at most a fraction
  of the pool in free cached blocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pagedkv import CacheConfig, FullAttentionSpec, HashExtras, KVCacheManager, Request
from pagedkv.errors import PinBudgetError
from pagedkv.retention.config import RetentionConfig
from pagedkv.retention.pins import PinLease
from pagedkv.retention.policy import RequestRetention, TokenRangeRetention
from pagedkv.sim.results import SimResult
from pagedkv.sim.workloads import SimRequest, Workload, request_block_hashes

__all__ = [
    "LRU",
    "PinPopularPrefixes",
    "PopularityPriority",
    "SimClock",
    "SimRetentionPolicy",
    "TenantQuota",
    "replay_pure_cache",
    "tenant_by_request_id",
]


class SimClock:
    """The simulated clock a policy's manager reads (seconds; set by the replay)."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class SimRetentionPolicy:
    """How a simulated engine uses retention. Base class: no retention (LRU)."""

    name = "lru"

    def config(self, *, num_blocks: int, clock: SimClock) -> RetentionConfig | None:
        """The manager's retention config (None: plain LRU)."""
        return None

    def tenant(self, request: SimRequest) -> str | None:
        """The tenant (cache salt) ``request`` is sent with (None: unsalted)."""
        return None

    def after_request(self, mgr: KVCacheManager, req: Request, num_hit_tokens: int) -> None:
        """Called after ``req`` was looked up and allocated, before it is freed: set its
        ``retention``, pin, ... Default: nothing."""


class LRU(SimRetentionPolicy):
    """No retention: vLLM's LRU."""


class _Popularity:
    """How many requests have carried each block hash so far (simulation only)."""

    def __init__(self) -> None:
        self.seen: dict[bytes, int] = {}

    def observe(self, hashes: list[bytes]) -> list[int]:
        """Counts of ``hashes`` including this request."""
        seen = self.seen
        out = []
        for h in hashes:
            c = seen.get(h, 0) + 1
            seen[h] = c
            out.append(c)
        return out


@dataclass
class PinPopularPrefixes(SimRetentionPolicy):
    """Pin a request's leading blocks that earlier requests also carried (a shared system
    prompt, seen twice) for ``ttl_s``, renewed by hits, within the pin budget."""

    ttl_s: float = 600.0
    budget_fraction: float = 0.5
    name: str = "pin-popular"
    _pop: _Popularity = field(default_factory=_Popularity)
    _leases: dict[bytes, PinLease] = field(default_factory=dict)

    def config(self, *, num_blocks: int, clock: SimClock) -> RetentionConfig | None:
        return RetentionConfig(clock=clock, pin_budget_fraction=self.budget_fraction)

    def after_request(self, mgr: KVCacheManager, req: Request, num_hit_tokens: int) -> None:
        assert mgr.retention is not None
        counts = self._pop.observe(req.block_hashes)
        n = 0
        while n < len(counts) and counts[n] >= 2:
            n += 1
        if not n:
            return
        last = req.block_hashes[n - 1]
        lease = self._leases.get(last)
        if lease is not None and lease.active:
            return  # pinned already; its hits refresh it
        with contextlib.suppress(PinBudgetError):  # over budget: stay unpinned
            self._leases[last] = mgr.retention.pin(req.block_hashes[:n], ttl_s=self.ttl_s,
                                                   refresh_on_hit=True)


@dataclass
class PopularityPriority(SimRetentionPolicy):
    """Blocks carried by several requests are freed at a higher priority: 35 + 15 per
    extra request that carried them, at most ``max_priority``."""

    max_priority: int = 95
    name: str = "popularity-priority"
    _pop: _Popularity = field(default_factory=_Popularity)

    def config(self, *, num_blocks: int, clock: SimClock) -> RetentionConfig | None:
        return RetentionConfig(clock=clock)

    def after_request(self, mgr: KVCacheManager, req: Request, num_hit_tokens: int) -> None:
        counts = self._pop.observe(req.block_hashes)
        bs = mgr.pool.hash_block_size
        ranges: list[TokenRangeRetention] = []
        start = 0
        for i in range(1, len(counts) + 1):
            if i == len(counts) or counts[i] != counts[start]:
                p = min(self.max_priority, 35 + 15 * (counts[start] - 1))
                if p != 35:
                    ranges.append(TokenRangeRetention(token_start=start * bs,
                                                      token_end=i * bs, priority=p))
                start = i
        if ranges:
            req.retention = RequestRetention(ranges=tuple(ranges))


def tenant_by_request_id(request: SimRequest) -> str | None:
    """The tenant named before the first ``/`` of the request id (None without one)."""
    head, sep, _ = request.request_id.partition("/")
    return head if sep else None


@dataclass
class TenantQuota(SimRetentionPolicy):
    """Tenants listed in ``fractions`` keep at most that fraction of the pool in free
    cached blocks."""

    fractions: dict[str, float] = field(default_factory=lambda: {"batch": 0.1})
    tenant_of: Callable[[SimRequest], str | None] = tenant_by_request_id
    name: str = "tenant-quota"

    def config(self, *, num_blocks: int, clock: SimClock) -> RetentionConfig | None:
        quotas: dict[str | None, int] = {t: int(f * num_blocks)
                                         for t, f in self.fractions.items()}
        return RetentionConfig(clock=clock, tenant_quota_blocks=quotas)

    def tenant(self, request: SimRequest) -> str | None:
        return self.tenant_of(request)


def replay_pure_cache(
    workload: Workload,
    *,
    block_size: int,
    num_blocks: int,
    policy: SimRetentionPolicy,
    check_invariants: bool = False,
) -> SimResult:
    """Replay ``workload`` in pure-cache mode under ``policy`` (module docstring).

    Raises:
        InvalidArgumentError: a block size the workload cannot be replayed at, or fewer
            than 2 blocks.
    """
    wall0 = time.perf_counter()
    clock = SimClock()
    reqs = workload.requests
    max_len = max((r.num_prompt_tokens + 1 for r in reqs), default=1)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128,
                             dtype_bytes=2)
    mgr = KVCacheManager(CacheConfig(
        groups=(spec,), num_blocks=num_blocks, max_model_len=max_len,
        retention=policy.config(num_blocks=num_blocks, clock=clock),
    ))
    n = len(reqs)
    res = SimResult(mode="pure-cache", workload=workload.name, block_size=block_size,
                    num_blocks=num_blocks, query_tokens=[r.num_prompt_tokens for r in reqs],
                    hit_tokens=[0] * n, lookup_time_s=[r.arrival_s for r in reqs])
    max_tokens = (num_blocks - 1) * block_size
    for i, r in enumerate(reqs):
        clock.now_s = max(clock.now_s, r.arrival_s)
        hashes = request_block_hashes(r, block_size, source_block_size=workload.source_block_size,
                                      index=i)
        tokens = r.prompt_token_ids if r.prompt_token_ids is not None else [0] * r.num_prompt_tokens
        salt = policy.tenant(r)
        req = mgr.new_request(r.request_id, tokens, block_hashes=hashes,
                              hash_extras=HashExtras(cache_salt=salt) if salt else None)
        hit = mgr.get_computed_blocks(req)
        res.hit_tokens[i] = hit.num_computed_tokens
        num_new = min(req.num_tokens, max_tokens) - hit.num_computed_tokens
        if num_new > 0:
            new = mgr.allocate_slots(req, num_new, new_computed_blocks=hit)
            if new is not None:
                policy.after_request(mgr, req, hit.num_computed_tokens)
                mgr.free(req)
        if check_invariants:
            mgr.check_invariants()
    res.evicted_blocks = mgr.num_evicted_blocks
    res.wall_s = time.perf_counter() - wall0
    return res
