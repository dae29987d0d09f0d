"""Pick a replica for a request: round-robin, least-loaded, or cache-aware.

Cost of sending a request of ``T`` prompt tokens to replica ``r`` (cache-aware)::

    cost(r) = prefill_token * (T - hit_tokens(r) + queued_prefill_tokens(r))
              + decode_seq * running_seqs(r)

``hit_tokens(r)`` is the longest prefix ``r`` can reuse, by the engine's own rules
(:mod:`pagedkv.cluster.hit_rules`) over the cluster index, so the first term is the
prefill work ahead of the request's first token on ``r``. The second term is the decode
load: every running sequence slows every step. Both are in token units: the default
``decode_seq = 5`` tokens is the default step-time model's ratio (0.1 ms per decoding
sequence / 20 µs per prefill token; :class:`pagedkv.sim.StepTimeModel`). Least-loaded is
the same cost with ``hit_tokens = 0``; ties go to the replica listed first.

If the index is unreachable, :class:`Router` routes least-loaded, logs a warning once,
and logs again (info) when the index answers again; :attr:`Router.degraded` tells which.
Salted prompts (``cache_salt``) have their own block hashes, so one tenant's prefixes are
never a hit for another.

Example::

    >>> from pagedkv import FullAttentionSpec
    >>> from pagedkv.cluster.index import MemoryIndex, Replica
    >>> index = MemoryIndex(model="m")
    >>> a, b = Replica(pod="a"), Replica(pod="b")
    >>> index.update(b, added=[(0, 7, "GPU"), (0, 8, "GPU")], removed=[])
    >>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    >>> router = Router(index, specs=[spec], policy=CacheAware())
    >>> loads = {a: ReplicaLoad(), b: ReplicaLoad(running_seqs=1)}  # costs 13 and 5 + 5
    >>> d = router.route([7, 8, 9], num_tokens=13, loads=loads)
    >>> d.replica.pod, d.hit_tokens
    ('b', 8)
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pagedkv import InvalidArgumentError, KVCacheSpec
from pagedkv.checks import check_number, check_whole
from pagedkv.cluster.hit_rules import PrefixRule, hybrid_hit_blocks, rules_for
from pagedkv.cluster.index import ANY_TIER, ClusterIndex, IndexUnavailableError, Replica
from pagedkv.core.records import MEDIUM_GPU
from pagedkv.errors import UnsupportedModelError

__all__ = [
    "POLICIES",
    "CacheAware",
    "CostWeights",
    "LeastLoaded",
    "Policy",
    "ReplicaLoad",
    "RoundRobin",
    "RouteDecision",
    "Router",
    "make_policy",
]

logger = logging.getLogger("pagedkv.cluster")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaLoad:
    """A replica's load as the caller sees it: prompt tokens admitted or queued but not
    computed yet, and sequences running (decoding)."""

    queued_prefill_tokens: int = 0
    running_seqs: int = 0

    def __post_init__(self) -> None:
        check_whole("ReplicaLoad.queued_prefill_tokens", self.queued_prefill_tokens)
        check_whole("ReplicaLoad.running_seqs", self.running_seqs)


@dataclass(frozen=True, slots=True, kw_only=True)
class CostWeights:
    """Weights of the cost function (module docstring), in tokens."""

    prefill_token: float = 1.0
    decode_seq: float = 5.0

    def __post_init__(self) -> None:
        for name in ("prefill_token", "decode_seq"):
            check_number(f"CostWeights.{name}", getattr(self, name), minimum=0, maximum=1e12)


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteDecision:
    """The chosen replica, the policy that chose it (``least-loaded`` when a cache-aware
    router fell back), its hit tokens and cost (None when not computed)."""

    replica: Replica
    policy: str
    hit_tokens: int
    cost: float | None
    degraded: bool = False
    all_hit_tokens: Mapping[Replica, int] = field(default_factory=dict)


class Policy(ABC):
    """How to choose among ``candidates`` (in the caller's order)."""

    name: str
    uses_index: bool = False

    @abstractmethod
    def choose(
        self,
        candidates: Sequence[Replica],
        loads: Mapping[Replica, ReplicaLoad],
        hits: Mapping[Replica, int],
        num_tokens: int,
    ) -> tuple[Replica, float | None]:
        """The chosen replica and its cost (None when the policy has none)."""


class RoundRobin(Policy):
    """Each replica in turn, ignoring load and cache."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(
        self,
        candidates: Sequence[Replica],
        loads: Mapping[Replica, ReplicaLoad],
        hits: Mapping[Replica, int],
        num_tokens: int,
    ) -> tuple[Replica, float | None]:
        replica = candidates[self._next % len(candidates)]
        self._next += 1
        return replica, None


class LeastLoaded(Policy):
    """The lowest load cost (the cost function with no hits)."""

    name = "least-loaded"

    def __init__(self, weights: CostWeights | None = None) -> None:
        self.weights = weights or CostWeights()

    def cost(self, load: ReplicaLoad, uncovered_tokens: int) -> float:
        w = self.weights
        return (
            w.prefill_token * (uncovered_tokens + load.queued_prefill_tokens)
            + w.decode_seq * load.running_seqs
        )

    def choose(
        self,
        candidates: Sequence[Replica],
        loads: Mapping[Replica, ReplicaLoad],
        hits: Mapping[Replica, int],
        num_tokens: int,
    ) -> tuple[Replica, float | None]:
        return _cheapest(candidates, lambda r: self.cost(loads[r], num_tokens))


class CacheAware(LeastLoaded):
    """The lowest cost with each replica's hit subtracted from the prefill work."""

    name = "cache-aware"
    uses_index = True

    def choose(
        self,
        candidates: Sequence[Replica],
        loads: Mapping[Replica, ReplicaLoad],
        hits: Mapping[Replica, int],
        num_tokens: int,
    ) -> tuple[Replica, float | None]:
        return _cheapest(
            candidates, lambda r: self.cost(loads[r], num_tokens - hits.get(r, 0))
        )


def _cheapest(
    candidates: Sequence[Replica], cost_of: Callable[[Replica], float]
) -> tuple[Replica, float]:
    best, best_cost = candidates[0], cost_of(candidates[0])
    for replica in candidates[1:]:
        cost = cost_of(replica)
        if cost < best_cost:
            best, best_cost = replica, cost
    return best, float(best_cost)


POLICIES = ("round-robin", "least-loaded", "cache-aware")


def make_policy(name: str, weights: CostWeights | None = None) -> Policy:
    """A fresh policy by name (one of :data:`POLICIES`); InvalidArgumentError otherwise."""
    if name == "round-robin":
        return RoundRobin()
    if name == "least-loaded":
        return LeastLoaded(weights)
    if name == "cache-aware":
        return CacheAware(weights)
    raise InvalidArgumentError(f"unknown router policy {name!r}; choose one of {POLICIES}")


class Router:
    """Routes requests over the replicas the caller lists, with one policy.

    ``specs``: the model's KV-cache groups (their hit rules; one block size);
    ``tier``: count only blocks on this tier (None: any tier). Not thread-safe.

    ``host_tier_weight`` (full-attention models, ``tier`` None): what a token found off
    the device is worth against one on ``device_tier``, e.g. 0.5 for host-memory blocks
    (``medium="CPU"`` events) that must be loaded before use. A replica's hit is then
    ``device + weight * (any tier - device)`` tokens, rounded down, from the longest
    prefix on ``device_tier`` and the longest on any tier: the device prefix, then the
    continuation a host tier serves (the lookup order of
    :class:`pagedkv.host.HostTieredKVCacheManager`).

    >>> from pagedkv import FullAttentionSpec
    >>> from pagedkv.cluster import CacheAware, MemoryIndex, Replica
    >>> index, a = MemoryIndex(model="m"), Replica(pod="a")
    >>> index.update(a, added=[(0, 1, "GPU"), (0, 2, "CPU"), (0, 3, "CPU")], removed=[])
    >>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    >>> Router(index, specs=[spec], policy=CacheAware()).hit_tokens([1, 2, 3], 13)
    {Replica(pod='a', dp_rank=None): 12}
    >>> Router(index, specs=[spec], policy=CacheAware(),
    ...        host_tier_weight=0.5).hit_tokens([1, 2, 3], 13)
    {Replica(pod='a', dp_rank=None): 8}
    """

    def __init__(
        self,
        index: ClusterIndex,
        *,
        specs: Sequence[KVCacheSpec],
        policy: Policy,
        tier: str | None = ANY_TIER,
        host_tier_weight: float | None = None,
        device_tier: str = MEDIUM_GPU,
    ) -> None:
        self.index = index
        self.policy = policy
        self.rules = rules_for(specs)
        self.block_size = specs[0].block_size
        self.tier = tier
        if host_tier_weight is not None:
            if (not isinstance(host_tier_weight, (int, float))
                    or not 0.0 <= host_tier_weight <= 1.0):
                raise InvalidArgumentError(
                    f"host_tier_weight must be a number in [0, 1], got {host_tier_weight!r}")
            if tier is not ANY_TIER:
                raise InvalidArgumentError(
                    "host_tier_weight weighs blocks found on any tier: leave tier=None")
            if not all(isinstance(rule, PrefixRule) for rule in self.rules):
                raise UnsupportedModelError(
                    "host_tier_weight supports full-attention models only (the host tier "
                    "serves those): drop it for hybrid models")
        self.host_tier_weight = host_tier_weight
        self.device_tier = device_tier
        self._fallback = LeastLoaded(policy.weights if isinstance(policy, LeastLoaded) else None)
        self.degraded = False

    def hit_tokens(self, block_hashes: Sequence[int], num_tokens: int) -> dict[Replica, int]:
        """Per replica with a hit, the tokens the engine would reuse for a prompt of
        ``num_tokens`` tokens whose full blocks have ``block_hashes`` (wire hashes).
        Raises IndexUnavailableError."""
        max_blocks = min(len(block_hashes), max(0, num_tokens - 1) // self.block_size)
        hashes = list(block_hashes[:max_blocks])
        if not hashes:
            return {}
        rules = self.rules
        full = [g for g, rule in enumerate(rules) if isinstance(rule, PrefixRule)]
        bounds: dict[Replica, int] | None = None
        for g in full:
            found = self.index.longest_prefix(g, hashes, tier=self.tier)
            bounds = found if bounds is None else {
                r: min(n, found[r]) for r, n in bounds.items() if r in found
            }
        if len(full) == len(rules):
            assert bounds is not None
            if self.host_tier_weight is not None:
                return self._weighted(hashes, bounds, full, self.host_tier_weight)
            return {r: n * self.block_size for r, n in bounds.items() if n}
        limit = max(bounds.values(), default=0) if bounds is not None else max_blocks
        held = {
            g: self.index.held_positions(g, hashes[:limit], tier=self.tier)
            for g in range(len(rules))
            if g not in full
        }
        replicas = set(bounds) if bounds is not None else set().union(*held.values())
        out: dict[Replica, int] = {}
        for replica in replicas:
            bound = bounds[replica] if bounds is not None else max_blocks
            presence = [
                range(bound) if g in full else held[g].get(replica, set())
                for g in range(len(rules))
            ]
            n = hybrid_hit_blocks(rules, [set(p) for p in presence], max_blocks=bound)
            if n:
                out[replica] = n * self.block_size
        return out

    def _weighted(
        self, hashes: Sequence[int], any_tier: dict[Replica, int], full: Sequence[int],
        weight: float,
    ) -> dict[Replica, int]:
        """Tier-weighted hit tokens (class docstring), from the any-tier prefix lengths."""
        device: dict[Replica, int] | None = None
        for g in full:
            found = self.index.longest_prefix(g, hashes, tier=self.device_tier)
            device = found if device is None else {
                r: min(n, found[r]) for r, n in device.items() if r in found
            }
        on_device = device or {}
        out: dict[Replica, int] = {}
        for replica, total in any_tier.items():
            fast = min(on_device.get(replica, 0), total)
            tokens = int((fast + weight * (total - fast)) * self.block_size)
            if tokens:
                out[replica] = tokens
        return out

    def route(
        self,
        block_hashes: Sequence[int],
        *,
        num_tokens: int,
        loads: Mapping[Replica, ReplicaLoad],
    ) -> RouteDecision:
        """Choose among ``loads``' replicas (in its order). Never raises for an
        unreachable index (falls back); InvalidArgumentError for no replicas."""
        candidates = list(loads)
        if not candidates:
            raise InvalidArgumentError("route() needs at least one replica in loads")
        policy = self.policy
        hits: dict[Replica, int] = {}
        if policy.uses_index:
            try:
                hits = self.hit_tokens(block_hashes, num_tokens)
            except IndexUnavailableError as exc:
                if not self.degraded:
                    logger.warning("cluster index unavailable (%s): routing least-loaded", exc)
                    self.degraded = True
                replica, cost = self._fallback.choose(candidates, loads, {}, num_tokens)
                return RouteDecision(replica=replica, policy=self._fallback.name,
                                     hit_tokens=0, cost=cost, degraded=True)
            if self.degraded:
                logger.info("cluster index reachable again: routing %s", policy.name)
                self.degraded = False
        replica, cost = policy.choose(candidates, loads, hits, num_tokens)
        return RouteDecision(replica=replica, policy=policy.name,
                             hit_tokens=hits.get(replica, 0), cost=cost, all_hit_tokens=hits)
