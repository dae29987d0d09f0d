#!/usr/bin/env python3
"""Speed of retention control, same run, alternating, median of N.

``harness``: the side-by-side harness workload (``kv_workload.py``) through
pagedkv without retention (``off``), with retention configured but nothing asked (``on``:
its digests must equal ``off``'s, i.e. vLLM's), and with every request asking for
retention plus a pinned system prompt (``active``); with ``--base-src DIR`` also the
same adapter on another checkout's ``src`` (``base``, e.g. the commit before retention),
which measures what the hooks cost the default path. Prints core ops/s per variant (best
of ``--rounds`` alternating runs: on a shared machine other processes only ever slow a run
down, as in compare_vllm.py) and the ratios to ``off``.

``inproc``: the harness workload in one process, retention off and ``active`` replayed
alternately (``--rounds`` each, the first side rotating): per side the best total core
op time and the sum over ops of count x median latency (robust to other processes
preempting this one), and active's ratio to off. Run it with another checkout's ``src``
on ``PYTHONPATH`` to measure that checkout the same way.

``paired``: the harness workload in one process driven through retention off and
``active`` side by side, call by call (the side going first alternating from call to
call), each side's core calls timed on their own: other processes slow both sides
alike, so the ratio is steady on a busy machine where whole-replay timings swing. The
replay asserts both sides hit the same tokens and neither refuses an allocation (the
harness workload never does), so both run the same calls. Per side the sum of core
call times and the sum over ops of count x median; median over ``--rounds``.

``lockstep``: retention off, configured but unused (uniform mode) and configured, converted
out of uniform mode with nothing asked (what ``on`` cost before the uniform mode), in one
process, operation by operation on ``pagedkv bench``'s workloads, first side rotating,
allocations checked equal; median of the per-round ops/s ratios to ``off``.

``pool-size``: per-operation cost with retention active at two pool sizes (default 10,000
and 1,000,000 blocks), each pool first filled with cached blocks spread over four priority
levels (some with durations): allocate 64 blocks (evicting 64 cached ones), free them,
look up 64 hit blocks; best of ``--rounds-ops``; with retention off beside it.

    python benchmarks/retention_speed.py harness --rounds 3 --base-src /tmp/pk_base/src
    python benchmarks/retention_speed.py harness --rounds 3 --before-src /tmp/pk_before/src \\
        -- --repeat 3
    python benchmarks/retention_speed.py harness --rounds 3 -- --trace \\
        data/traces/conversation_trace.jsonl.gz --trace-limit 1000 --concurrency 16
    python benchmarks/retention_speed.py inproc --rounds 3
    python benchmarks/retention_speed.py paired --rounds 3
    python benchmarks/retention_speed.py lockstep --rounds 3
    python benchmarks/retention_speed.py pool-size
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BS = 16


def _run(cmd: list[str], env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    res: dict = json.loads(out.strip().splitlines()[-1])  # type: ignore[type-arg]
    if "repeats_core_ops_per_s" in res:  # --repeat N: the best repeat of this process
        res["core_ops_per_s"] = max(res["repeats_core_ops_per_s"])
    return res


def harness(a: argparse.Namespace) -> None:
    flags = [f for f in a.workload if f != "--"]
    plain = [sys.executable, os.path.join(HERE, "vllm_compare_adapter.py"), *flags]
    ret = [sys.executable, os.path.join(HERE, "retention_adapter.py"), *flags]
    variants: dict[str, tuple[list[str], dict[str, str] | None]] = {
        "off": (plain, None),
        "on": ([*ret, "--retention", "on"], None),
        "active": ([*ret, "--retention", "active"], None),
    }
    if a.base_src:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(a.base_src))
        variants["base"] = (plain, env)
    if a.before_src:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(a.before_src))
        variants["on@before"] = ([*ret, "--retention", "on"], env)
        variants["active@before"] = ([*ret, "--retention", "active"], env)
    runs: dict[str, list[dict]] = {k: [] for k in variants}  # type: ignore[type-arg]
    names = list(variants)
    for i in range(a.rounds):
        k = i % len(names)  # the first side rotates from round to round
        for name in names[k:] + names[:k]:
            cmd, env = variants[name]
            runs[name].append(_run(cmd, env))
    print(f"workload: {' '.join(flags) or '(harness default)'}; {a.rounds} rounds, "
          "order rotating; best of the rounds, and the median of the per-round ratios")
    off = max(r["core_ops_per_s"] for r in runs["off"])
    print(f"{'variant':<13} {'core ops/s':>12} {'best/off':>9} {'median ratio':>13} "
          f"{'digest_lookup':>18} {'digest_alloc':>18}")
    for name, rs in runs.items():
        v = max(r["core_ops_per_s"] for r in rs)
        ratios = sorted(r["core_ops_per_s"] / o["core_ops_per_s"]
                        for r, o in zip(rs, runs["off"], strict=True))
        med = ratios[len(ratios) // 2]
        print(f"{name:<13} {v:>12,.0f} {v / off:>9.3f} {med:>13.3f} "
              f"{rs[0]['digest_lookup']:>18} {rs[0]['digest_alloc']:>18}")


def inproc(a: argparse.Namespace) -> None:
    """Off vs active on the harness workload, replayed alternately in this process."""
    sys.path.insert(0, HERE)
    import kv_workload as workload
    from retention_adapter import RetentionAdapter
    from vllm_compare_adapter import PagedKVAdapter

    ap = argparse.ArgumentParser()
    ap.add_argument("--retention", default="active")
    workload.add_workload_args(ap)
    args = ap.parse_args([])
    specs = workload.build_workload(args)
    args.max_model_len = max(len(s.prompt) + len(s.decode) for s in specs)
    makers = {"off": PagedKVAdapter, "active": RetentionAdapter}
    res: dict[str, list[dict]] = {k: [] for k in makers}  # type: ignore[type-arg]
    for r in range(a.rounds):
        order = list(makers) if r % 2 == 0 else list(makers)[::-1]
        for name in order:
            adapter = makers[name](args)
            res[name].append(workload.replay(adapter, specs, args.concurrency, digest=False))
            del adapter
    ops = ("lookup", "allocate_prefill", "allocate_decode", "free")
    summary = {}
    for name, rs in res.items():
        best = min(o["core_op_time_s"] for o in rs)
        p50 = {k: min(o["ops"][k]["p50_us"] for o in rs) for k in ops}
        est = sum(p50[k] * rs[0]["ops"][k]["count"] for k in ops) / 1e6
        summary[name] = (best, est, p50)
    print(f"harness workload in one process, {a.rounds} rounds alternating; "
          "p50 us per op (best round)")
    print(f"{'side':<7} {'core s':>8} {'p50 sum s':>10} " + " ".join(f"{k:>17}" for k in ops))
    for name, (best, est, p50) in summary.items():
        print(f"{name:<7} {best:>8.3f} {est:>10.3f} " + " ".join(f"{p50[k]:>17.2f}" for k in ops))
    (b0, e0, _), (b1, e1, _) = summary["off"], summary["active"]
    print(f"active / off ops/s: core {b0 / b1:.3f}, p50 sum {e0 / e1:.3f}")


class _PairedAdapter:
    """Two harness adapters driven call by call; each side's core calls timed apart."""

    CORE = ("lookup", "allocate_prefill", "allocate_decode", "free")

    def __init__(self, sides: dict[str, object]) -> None:
        self.names = list(sides)
        self.sides = [sides[k] for k in self.names]
        self.times: dict[str, dict[str, list[int]]] = {
            k: {op: [] for op in self.CORE} for k in self.names}
        self._flip = 0

    def _both(self, op: str, args_of, timed: bool):  # type: ignore[no-untyped-def]
        perf = time.perf_counter_ns
        self._flip ^= 1
        order = (0, 1) if self._flip else (1, 0)
        out: list[object] = [None, None]
        for i in order:
            t0 = perf()
            out[i] = getattr(self.sides[i], op)(*args_of(i))
            dt = perf() - t0
            if timed:
                self.times[self.names[i]][op].append(dt)
        return out

    def make_request(self, spec):  # type: ignore[no-untyped-def]
        return self._both("make_request", lambda i: (spec,), False)

    def hash_prompt(self, req) -> None:  # type: ignore[no-untyped-def]
        self._both("hash_prompt", lambda i: (req[i],), False)

    def lookup(self, req):  # type: ignore[no-untyped-def]
        out = self._both("lookup", lambda i: (req[i],), True)
        assert out[0][1] == out[1][1], "the sides hit different token counts"  # type: ignore[index]
        return [o[0] for o in out], out[0][1]  # type: ignore[index]

    def lookup_block_ids(self, handle):  # type: ignore[no-untyped-def]
        return []

    def allocate_prefill(self, req, n_new, n_computed, handle):  # type: ignore[no-untyped-def]
        out = self._both("allocate_prefill",
                         lambda i: (req[i], n_new, n_computed, handle[i]), True)
        assert out[0] is not None and out[1] is not None, "a side refused a prefill"
        return out[0]

    def after_prefill(self, req) -> None:  # type: ignore[no-untyped-def]
        self._both("after_prefill", lambda i: (req[i],), False)

    def append_token(self, req, tok) -> None:  # type: ignore[no-untyped-def]
        self._both("append_token", lambda i: (req[i], tok), False)

    def allocate_decode(self, req):  # type: ignore[no-untyped-def]
        out = self._both("allocate_decode", lambda i: (req[i],), True)
        assert out[0] is not None and out[1] is not None, "a side refused a decode"
        return out[0]

    def after_decode(self, req) -> None:  # type: ignore[no-untyped-def]
        self._both("after_decode", lambda i: (req[i],), False)

    def free(self, req) -> None:  # type: ignore[no-untyped-def]
        self._both("free", lambda i: (req[i],), True)

    def take_events(self) -> int:
        return -1

    def usage(self) -> float:
        return float(self.sides[0].usage())  # type: ignore[attr-defined]

    def num_free_blocks(self) -> int:
        return int(self.sides[0].num_free_blocks())  # type: ignore[attr-defined]

    def extra_stats(self) -> dict[str, object]:
        return {}


def paired(a: argparse.Namespace) -> None:
    """Off vs active on the harness workload, call by call in one process."""
    import statistics

    sys.path.insert(0, HERE)
    import kv_workload as workload
    from retention_adapter import RetentionAdapter
    from vllm_compare_adapter import PagedKVAdapter

    ap = argparse.ArgumentParser()
    ap.add_argument("--retention", default="active")
    workload.add_workload_args(ap)
    args = ap.parse_args([])
    specs = workload.build_workload(args)
    args.max_model_len = max(len(s.prompt) + len(s.decode) for s in specs)
    ops = _PairedAdapter.CORE
    sums: dict[str, list[float]] = {"off": [], "active": []}
    p50s: dict[str, list[float]] = {"off": [], "active": []}
    per_op: dict[str, dict[str, list[float]]] = {k: {op: [] for op in ops} for k in sums}
    for r in range(a.rounds):
        names = ["off", "active"] if r % 2 == 0 else ["active", "off"]
        makers = {"off": PagedKVAdapter, "active": RetentionAdapter}
        pair = _PairedAdapter({k: makers[k](args) for k in names})
        workload.replay(pair, specs, args.concurrency, digest=False)  # type: ignore[arg-type]
        for k, t in pair.times.items():
            sums[k].append(sum(sum(v) for v in t.values()) / 1e9)
            meds = {op: statistics.median(t[op]) / 1e3 for op in ops}
            for op in ops:
                per_op[k][op].append(meds[op])
            p50s[k].append(sum(meds[op] * len(t[op]) for op in ops) / 1e6)
    print(f"harness workload, off and active call by call in one process, {a.rounds} "
          "rounds; medians over rounds")
    print(f"{'side':<7} {'core s':>8} {'p50 sum s':>10} " + " ".join(f"{k:>17}" for k in ops))
    for k in sums:
        print(f"{k:<7} {statistics.median(sums[k]):>8.3f} {statistics.median(p50s[k]):>10.3f} "
              + " ".join(f"{statistics.median(per_op[k][op]):>17.2f}" for op in ops))
    core = statistics.median(o / x for o, x in zip(sums["off"], sums["active"], strict=True))
    p50 = statistics.median(o / x for o, x in zip(p50s["off"], p50s["active"], strict=True))
    print(f"active / off ops/s: core {core:.3f}, p50 sum {p50:.3f} (median of per-round "
          "ratios)")


def lockstep(a: argparse.Namespace) -> None:
    """off / on (uniform mode) / on, specialised (the retention queue with nothing asked:
    the code 'on' ran before the uniform mode) in one process, operation by operation,
    the side going first rotating; allocations checked equal. Median of per-round ratios."""
    import statistics

    sys.path.insert(0, HERE)
    from lockstep import replay_lockstep

    from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
    from pagedkv.bench import BenchConfig, build_workload
    from pagedkv.retention import RetentionConfig, RetentionPool

    spec = FullAttentionSpec(block_size=BS, num_kv_heads=8, head_size=128, dtype_bytes=2)
    sides = ("off", "on", "on-specialised")
    print(f"lockstep, {a.num_requests} requests, median of {a.rounds} rounds "
          "(core op seconds summed per side; ratio = off's ops/s share)")
    print(f"{'workload':<15} " + " ".join(f"{s_:>15}" for s_ in sides))
    for wl in a.workloads:
        specs, num_blocks = build_workload(BenchConfig(workload=wl,
                                                       num_requests=a.num_requests))
        ratios: list[list[float]] = [[] for _ in sides]
        for _ in range(a.rounds):
            mgrs = []
            for side in sides:
                ret = RetentionConfig() if side != "off" else None
                m = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=num_blocks,
                                               max_model_len=1 << 16, retention=ret))
                if side == "on-specialised":
                    assert isinstance(m.pool, RetentionPool)
                    m.pool.specialise()
                mgrs.append(m)
            spent = replay_lockstep(mgrs, specs)
            for k in range(len(sides)):
                ratios[k].append(spent[0] / spent[k])
        print(f"{wl:<15} " + " ".join(f"{statistics.median(r):>15.3f}" for r in ratios))


def _fill(mgr, rng, priorities, retention_cls, range_cls) -> None:  # type: ignore[no-untyped-def]
    """Cache the whole pool: 64-block requests with supplied hashes, spread over levels."""
    n = 0
    target = mgr.pool.num_blocks - 1 - 2 * 64
    while mgr.pool.num_cached_blocks() < target:
        p, d = priorities[n % len(priorities)]
        r = retention_cls(ranges=(range_cls(priority=p, duration_s=d),)) if retention_cls else None
        hashes = [b"f%d-%d" % (n, i) for i in range(64)]
        req = mgr.new_request(f"fill{n}", [0] * (64 * BS), block_hashes=hashes, retention=r)
        if mgr.allocate_slots(req, req.num_tokens) is None:
            break
        mgr.free(req)
        n += 1


def pool_size_row(num_blocks: int, variant: str, rounds: int) -> dict[str, float]:
    import random

    from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
    from pagedkv.retention import RequestRetention, RetentionConfig, TokenRangeRetention

    spec = FullAttentionSpec(block_size=BS, num_kv_heads=8, head_size=128, dtype_bytes=2)
    clock = [0.0]
    active = variant == "active"
    retention = RetentionConfig(clock=lambda: clock[0]) if variant != "off" else None
    mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=num_blocks,
                                     max_model_len=1 << 20, retention=retention))
    levels = [(10, None), (35, None), (60, 5.0), (90, None)]
    rng = random.Random(0)
    _fill(mgr, rng, levels, RequestRetention if active else None, TokenRangeRetention)
    hot = mgr.new_request("hot", [0] * (64 * BS + 1),
                          block_hashes=[b"hot%d" % i for i in range(64)])
    mgr.allocate_slots(hot, hot.num_tokens)  # kept in use: never evicted
    probe = mgr.new_request("probe", [0] * (64 * BS + 1),
                            block_hashes=[b"hot%d" % i for i in range(64)])
    ask = RequestRetention(ranges=(TokenRangeRetention(priority=20),)) if active else None
    best = {"allocate_64": 1e9, "free_64": 1e9, "lookup_64": 1e9}
    for i in range(rounds):
        clock[0] += 0.01
        req = mgr.new_request(f"m{i}", [0] * (64 * BS),
                              block_hashes=[b"m%d-%d" % (i, j) for j in range(64)],
                              retention=ask)
        t = time.perf_counter()
        mgr.allocate_slots(req, req.num_tokens)
        best["allocate_64"] = min(best["allocate_64"], time.perf_counter() - t)
        t = time.perf_counter()
        mgr.free(req)
        best["free_64"] = min(best["free_64"], time.perf_counter() - t)
        t = time.perf_counter()
        hit = mgr.get_computed_blocks(probe)
        best["lookup_64"] = min(best["lookup_64"], time.perf_counter() - t)
        assert hit.num_computed_tokens == 64 * BS
    return {k: v * 1e6 for k, v in best.items()}


def pool_size(a: argparse.Namespace) -> None:
    rows = {}
    variants = ("off", "on", "active")
    for n in a.sizes:
        for v in variants:
            rows[(n, v)] = pool_size_row(n, v, a.rounds_ops)
    print(f"best of {a.rounds_ops}, microseconds per call")
    print(f"{'blocks':>10} {'retention':>9} {'allocate_64':>12} {'free_64':>9} "
          f"{'lookup_64':>10}")
    for (n, v), r in rows.items():
        print(f"{n:>10,} {v:>9} {r['allocate_64']:>12.1f} {r['free_64']:>9.1f} "
              f"{r['lookup_64']:>10.1f}")
    small, big = a.sizes[0], a.sizes[-1]
    for v in variants:
        s, b = rows[(small, v)], rows[(big, v)]
        ratios = " ".join(f"{k}={b[k] / s[k]:.2f}" for k in s)
        print(f"{v}: {big:,} / {small:,} blocks: {ratios}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("harness")
    h.add_argument("--rounds", type=int, default=3)
    h.add_argument("--base-src", default=None,
                   help="a checkout's src directory to measure as 'base' (PYTHONPATH)")
    h.add_argument("--before-src", default=None,
                   help="a checkout's src directory whose retention code to measure as "
                   "'on@before' and 'active@before' (PYTHONPATH)")
    h.add_argument("workload", nargs=argparse.REMAINDER)
    ip = sub.add_parser("inproc")
    ip.add_argument("--rounds", type=int, default=3)
    pp = sub.add_parser("paired")
    pp.add_argument("--rounds", type=int, default=3)
    ls = sub.add_parser("lockstep")
    ls.add_argument("--rounds", type=int, default=3)
    ls.add_argument("--num-requests", type=int, default=2000)
    ls.add_argument("--workloads", nargs="+",
                    default=["shared-prefix", "heavy-eviction", "no-sharing"])
    p = sub.add_parser("pool-size")
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    p.add_argument("--rounds-ops", type=int, default=200)
    a = ap.parse_args()
    {"harness": harness, "inproc": inproc, "paired": paired, "lockstep": lockstep,
     "pool-size": pool_size}[a.cmd](a)


if __name__ == "__main__":
    main()
