"""``pagedkv bench``: the manager's own speed on standard workloads.

A workload is replayed through a small continuous-batching loop (admit up to
``concurrency`` requests per step: hash prompt -> lookup -> allocate the prompt; then one
decode step per running request: append a token -> allocate one slot; free a request after
its last decode step). Every manager call is timed; the report gives operations per second,
per-operation latency percentiles, the manager time per scheduler step, and memory.

Workloads (all deterministic from ``--seed``):

* ``shared-prefix``: every request = one 1024-token system prompt + 16-512 random tokens,
  16-128 decode steps (the side-by-side harness's default workload);
* ``heavy-eviction``: 8 system prompts, 80 % of requests use one, a pool of 1,500 blocks;
* ``no-sharing``: random prompts only (pure allocation cost).

A request that does not fit even into an empty pool is skipped and counted
(``rejected_requests``); a run in which no request fits is an error, not a figure. The
numbers are for comparing configurations on one machine in one run, not absolute.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import tracemalloc
from collections import deque
from dataclasses import dataclass
from typing import Any

from pagedkv.checks import check_flag, check_whole
from pagedkv.cli_args import whole_arg
from pagedkv.core.manager import KVCacheManager
from pagedkv.core.request import Request
from pagedkv.core.specs import FullAttentionSpec
from pagedkv.errors import ConfigError, InvalidArgumentError

__all__ = ["BenchConfig", "add_parser", "build_workload", "run_bench"]

WORKLOADS = ("shared-prefix", "heavy-eviction", "no-sharing")
OPS = ("hash_prompt", "lookup", "allocate_prefill", "append_token", "allocate_decode", "free")
CORE_OPS = ("lookup", "allocate_prefill", "allocate_decode", "free")
# A pool of this many blocks takes about 1 GiB of bookkeeping; more is a typo, not a benchmark.
_MAX_BENCH_BLOCKS = 10_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    workload: str = "shared-prefix"
    num_requests: int = 2000
    num_blocks: int | None = None
    block_size: int = 16
    concurrency: int = 32
    hash_algo: str = "sha256_cbor"
    enable_events: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise InvalidArgumentError(
                f"unknown workload {self.workload!r}; choose one of {', '.join(WORKLOADS)}")
        if self.hash_algo not in ("sha256_cbor", "xxhash_cbor"):
            raise InvalidArgumentError(
                f"hash_algo must be 'sha256_cbor' or 'xxhash_cbor', got {self.hash_algo!r}")
        check_flag("BenchConfig.enable_events", self.enable_events)
        check_whole("BenchConfig.seed", self.seed, minimum=None)
        for name in ("num_requests", "block_size", "concurrency"):
            value = getattr(self, name)
            check_whole(name, value, minimum=1, maximum=10_000_000)
        if self.num_blocks is not None and (
                isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int)
                or not 2 <= self.num_blocks <= _MAX_BENCH_BLOCKS):
            raise InvalidArgumentError(
                f"num_blocks must be between 2 and {_MAX_BENCH_BLOCKS:,} (block 0 is the null "
                f"block), got {self.num_blocks!r}")


@dataclass(frozen=True, slots=True)
class _Spec:
    rid: str
    prompt: list[int]
    decode: list[int]


def build_workload(cfg: BenchConfig) -> tuple[list[_Spec], int]:
    rng = random.Random(cfg.seed)
    vocab = 32000
    if cfg.workload == "shared-prefix":
        num_prompts, shared_fraction, num_blocks = 1, 1.0, 10_000
    elif cfg.workload == "heavy-eviction":
        num_prompts, shared_fraction, num_blocks = 8, 0.8, 1500
    elif cfg.workload == "no-sharing":
        num_prompts, shared_fraction, num_blocks = 1, 0.0, 10_000
    else:  # BenchConfig checked the name
        raise AssertionError(cfg.workload)
    prompts = [[rng.randrange(vocab) for _ in range(1024)] for _ in range(num_prompts)]
    specs = []
    for i in range(cfg.num_requests):
        prefix = prompts[i % num_prompts] if rng.random() < shared_fraction else []
        suffix = [rng.randrange(vocab) for _ in range(rng.randint(16, 512))]
        decode = [rng.randrange(vocab) for _ in range(rng.randint(16, 128))]
        specs.append(_Spec(f"req-{i}", prefix + suffix, decode))
    return specs, cfg.num_blocks or num_blocks


def _percentiles(ns: list[int]) -> dict[str, float]:
    if not ns:
        return {"count": 0}
    s = sorted(ns)
    n = len(s)
    return {
        "count": n,
        "mean_us": round(sum(s) / n / 1e3, 3),
        "p50_us": round(s[n // 2] / 1e3, 3),
        "p99_us": round(s[min(n - 1, int(0.99 * n))] / 1e3, 3),
        "max_us": round(s[-1] / 1e3, 3),
    }


@dataclass
class _Replay:
    """What one replay of a workload measured and counted."""

    times: dict[str, list[int]]
    step_ns: list[int]
    steps: int
    hit_tokens: int
    prompt_tokens: int
    preempted: int
    rejected: int
    wall_s: float


def _replay(mgr: KVCacheManager, specs: list[_Spec], cfg: BenchConfig) -> _Replay:
    """Drive ``mgr`` through the workload ``specs`` (continuous batching of
    ``cfg.concurrency`` requests), timing every manager call."""
    perf = time.perf_counter_ns
    times: dict[str, list[int]] = {k: [] for k in OPS}
    step_ns: list[int] = []
    pending = deque(specs)
    running: list[list[Any]] = []
    hit_tokens = prompt_tokens = steps = preempted = rejected = 0
    hasher = mgr.hasher
    wall0 = time.perf_counter()
    def timed(op: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t = perf()
        out = fn(*args, **kwargs)
        times[op].append(perf() - t)
        return out

    while pending or running:
        steps += 1
        step0 = perf()
        while pending and len(running) < cfg.concurrency:
            s = pending[0]
            req = Request(s.rid, s.prompt)
            timed("hash_prompt", req.set_hasher, hasher)
            hit = timed("lookup", mgr.get_computed_blocks, req)
            new = timed("allocate_prefill", mgr.allocate_slots, req,
                        req.num_tokens - hit.num_computed_tokens, new_computed_blocks=hit)
            if new is None:
                if running:
                    break
                pending.popleft()  # does not fit even into the emptiest pool this run has
                rejected += 1
                continue
            pending.popleft()
            req.num_computed_tokens = req.num_tokens
            prompt_tokens += req.num_tokens
            hit_tokens += hit.num_computed_tokens
            running.append([req, s, 0])
        still = []
        for item in running:
            req, s, i = item
            timed("append_token", req.append_output_tokens, s.decode[i])
            new = timed("allocate_decode", mgr.allocate_slots, req, 1)
            done = new is None or i + 1 >= len(s.decode)
            if new is None:
                preempted += 1
            else:
                req.num_computed_tokens += 1
            if done:
                timed("free", mgr.free, req)
            else:
                item[2] = i + 1
                still.append(item)
        running = still
        if cfg.enable_events:
            mgr.take_events()
        step_ns.append(perf() - step0)
    wall_s = time.perf_counter() - wall0
    return _Replay(times, step_ns, steps, hit_tokens, prompt_tokens, preempted, rejected,
                   wall_s)


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Replay the workload once on a fresh manager; return the report as a dict."""
    specs, num_blocks = build_workload(cfg)
    max_len = max(len(s.prompt) + len(s.decode) for s in specs)
    spec = FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=8, head_size=128,
                             dtype_bytes=2)
    tracemalloc.start()
    t0 = time.perf_counter()
    mgr = KVCacheManager.from_spec(spec, num_blocks=num_blocks, max_model_len=max_len,
                                   hash_algo=cfg.hash_algo, enable_events=cfg.enable_events)
    build_s = time.perf_counter() - t0
    pool_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()

    r = _replay(mgr, specs, cfg)
    times, steps, rejected = r.times, r.steps, r.rejected
    if rejected == len(specs):
        raise ConfigError(
            f"no request fits into {num_blocks:,} blocks of {cfg.block_size} tokens (the "
            f"largest prompt needs {-(-max(len(s.prompt) for s in specs) // cfg.block_size):,} "
            "blocks plus the null block); raise --num-blocks")

    core_n = sum(len(times[k]) for k in CORE_OPS)
    core_ns = sum(sum(times[k]) for k in CORE_OPS)
    all_n = sum(len(v) for v in times.values())
    all_ns = sum(sum(v) for v in times.values())
    return {
        "workload": cfg.workload,
        "num_requests": len(specs),
        "num_blocks": num_blocks,
        "block_size": cfg.block_size,
        "hash_algo": cfg.hash_algo,
        "events": cfg.enable_events,
        "core_ops_per_s": round(core_n / (core_ns / 1e9), 1),
        "core_plus_hash_ops_per_s": round(all_n / (all_ns / 1e9), 1),
        "ops": {k: _percentiles(v) for k, v in times.items()},
        "manager_us_per_step": round(all_ns / steps / 1e3, 2),
        "step": _percentiles(r.step_ns),
        "steps": steps,
        "hit_rate": round(r.hit_tokens / r.prompt_tokens, 6) if r.prompt_tokens else 0.0,
        "failed_decodes": r.preempted,
        "rejected_requests": rejected,
        "pool_build_s": round(build_s, 4),
        "pool_bytes_per_block": round(pool_bytes / num_blocks, 1),
        "wall_s": round(r.wall_s, 3),
    }


def _print_table(r: dict[str, Any]) -> None:
    print(f"pagedkv bench: {r['workload']}  requests={r['num_requests']} "
          f"blocks={r['num_blocks']} block_size={r['block_size']} hash={r['hash_algo']} "
          f"events={'on' if r['events'] else 'off'}")
    print(f"  core ops/s           {r['core_ops_per_s']:>12,.0f}   (lookup + allocate + free)")
    print(f"  core+hash ops/s      {r['core_plus_hash_ops_per_s']:>12,.0f}")
    print(f"  manager time/step    {r['manager_us_per_step']:>12,.1f} us over {r['steps']} steps")
    print(f"  hit rate             {r['hit_rate']:>12.4f}")
    if r["rejected_requests"]:
        print(f"  rejected requests    {r['rejected_requests']:>12,}   (did not fit the pool; "
              "not timed beyond the refused call)")
    print(f"  pool build           {r['pool_build_s'] * 1e3:>12.2f} ms, "
          f"{r['pool_bytes_per_block']:.1f} bytes/block")
    print(f"  {'operation':<18} {'count':>8} {'mean us':>9} {'p50 us':>9} {'p99 us':>9}")
    for name, o in r["ops"].items():
        if o["count"]:
            print(f"  {name:<18} {o['count']:>8} {o['mean_us']:>9.2f} {o['p50_us']:>9.2f} "
                  f"{o['p99_us']:>9.2f}")


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "bench", help="measure the manager's speed on a standard workload",
        description="Replay a deterministic workload through a continuous-batching loop on a "
        "fresh manager and report operations per second, per-operation latency percentiles "
        "and pool memory. Compare figures within one run on one machine only.",
        epilog="workloads: shared-prefix (one 1,024-token system prompt + 16-512 random "
        "tokens, the side-by-side harness's default), heavy-eviction (8 system prompts, "
        "1,500 blocks), no-sharing (random prompts only)")
    p.add_argument("--workload", choices=WORKLOADS, default="shared-prefix",
                   help="which workload to replay (default: %(default)s)")
    p.add_argument("--num-requests", type=_positive_int, default=2000,
                   help="requests in the workload (default: %(default)s)")
    p.add_argument("--num-blocks", type=_positive_int, default=None,
                   help="pool size in blocks, null block included "
                        "(default: 10,000; 1,500 for heavy-eviction)")
    p.add_argument("--block-size", type=_positive_int, default=16,
                   help="tokens per block (default: %(default)s)")
    p.add_argument("--concurrency", type=_positive_int, default=32,
                   help="requests running at once (default: %(default)s)")
    p.add_argument("--hash-algo", choices=("sha256_cbor", "xxhash_cbor"), default="sha256_cbor",
                   help="block hash function (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="workload random seed (default: %(default)s)")
    p.add_argument("--events", action="store_true", help="buffer KV events, drain each step")
    p.add_argument("--repeat", type=whole_arg("--repeat", minimum=1, maximum=1000), default=1,
                   help="runs on fresh managers; the median core ops/s is shown")
    p.add_argument("--smoke", action="store_true", help="a tiny run (200 requests) for CI")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cfg = BenchConfig(
        workload=args.workload,
        num_requests=200 if args.smoke else args.num_requests,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        concurrency=args.concurrency,
        hash_algo=args.hash_algo,
        enable_events=args.events,
        seed=args.seed,
    )
    results = [run_bench(cfg) for _ in range(args.repeat)]
    results.sort(key=lambda r: r["core_ops_per_s"])
    report = results[len(results) // 2]
    if len(results) > 1:
        report["repeats_core_ops_per_s"] = [r["core_ops_per_s"] for r in results]
    if args.json:
        print(json.dumps(report))
    else:
        _print_table(report)
    return 0
