"""The workload simulator behind ``pagedkv simulate``.

Pieces, each usable on its own (all built on the public :mod:`pagedkv` API only):

* :mod:`~pagedkv.sim.workloads` — a workload is a tuple of :class:`SimRequest`; loaders for
  Mooncake-style JSONL traces (``hash_ids``) and Azure-style CSV traces (lengths only), and
  the block hashes a request has at a given block size;
* :mod:`~pagedkv.sim.generators` — synthetic workloads with an analytic ideal hit rate;
* :mod:`~pagedkv.sim.scheduler` — continuous batching on a :class:`pagedkv.KVCacheManager`
  with a simulated clock (engine mode);
* :mod:`~pagedkv.sim.pure_cache` — lookup, store, free, one request at a time;
* :mod:`~pagedkv.sim.bounds` — the infinite-cache ceiling and the offline-optimal (Belady)
  hit rate at a capacity;
* :mod:`~pagedkv.sim.report` — terminal table, JSON, PNG plots;
* :mod:`~pagedkv.sim.options` — every ``simulate`` option, declared once, and
  :mod:`~pagedkv.sim.setup` — what their values ask for (a :class:`SimConfig`, the
  workload, output, observe and replica settings);
* :mod:`~pagedkv.sim.cli` — the ``simulate`` subcommand (parse, call, render).
"""

from pagedkv.sim.api import SimConfig, capacity_for, run
from pagedkv.sim.bounds import BoundResult, belady_hits, infinite_cache_hits
from pagedkv.sim.engine import EngineSimulator
from pagedkv.sim.generators import agent_loops, multi_turn, system_prompts
from pagedkv.sim.loaders import load_trace
from pagedkv.sim.pure_cache import PureCacheResult, run_pure_cache
from pagedkv.sim.results import SimResult
from pagedkv.sim.scheduler import (
    EngineResult,
    SchedulerConfig,
    StepTimeModel,
)
from pagedkv.sim.summary import SimReport, Verdict
from pagedkv.sim.workloads import (
    SimRequest,
    Workload,
    bundled_trace_path,
    request_block_hashes,
)

__all__ = [
    "BoundResult",
    "EngineResult",
    "EngineSimulator",
    "PureCacheResult",
    "SchedulerConfig",
    "SimConfig",
    "SimReport",
    "SimRequest",
    "SimResult",
    "StepTimeModel",
    "Verdict",
    "Workload",
    "agent_loops",
    "belady_hits",
    "bundled_trace_path",
    "capacity_for",
    "infinite_cache_hits",
    "load_trace",
    "multi_turn",
    "request_block_hashes",
    "run",
    "run_pure_cache",
    "system_prompts",
]
