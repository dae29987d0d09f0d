"""Many replicas in production: a cluster prefix index, its ingest, a cache-aware router.

* :mod:`~pagedkv.cluster.index` — replicas, block references, the index interface and the
  in-process backend :class:`MemoryIndex`;
* :mod:`~pagedkv.cluster.redis_index` — the Redis/Valkey backend (``cluster`` extra);
* :mod:`~pagedkv.cluster.ingest` — events of many publishers into an index, with the
  recovery rules;
* :mod:`~pagedkv.cluster.hit_rules` — the engine's per-group hit rules over the index;
* :mod:`~pagedkv.cluster.router` — round-robin, least-loaded, cache-aware;
* :mod:`~pagedkv.cluster.service` — the ``pagedkv index serve`` loop;
* :mod:`~pagedkv.cluster.cli` — ``pagedkv index serve`` and ``pagedkv index query``.

The multi-replica *simulation* (N simulated engines behind this router) is
:mod:`pagedkv.sim.replicas`; nothing here imports the simulator. See docs/cluster.md.
"""

from pagedkv.cluster.index import (
    BlockRef,
    ClusterIndex,
    IndexUnavailableError,
    MemoryIndex,
    Replica,
    ReplicaState,
)
from pagedkv.cluster.ingest import IndexIngest
from pagedkv.cluster.router import (
    POLICIES,
    CacheAware,
    CostWeights,
    LeastLoaded,
    ReplicaLoad,
    RoundRobin,
    RouteDecision,
    Router,
    make_policy,
)

__all__ = [
    "POLICIES",
    "BlockRef",
    "CacheAware",
    "ClusterIndex",
    "CostWeights",
    "IndexIngest",
    "IndexUnavailableError",
    "LeastLoaded",
    "MemoryIndex",
    "Replica",
    "ReplicaLoad",
    "ReplicaState",
    "RoundRobin",
    "RouteDecision",
    "Router",
    "make_policy",
]
