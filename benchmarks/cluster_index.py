"""Cluster index figures: ingest block events/s, 512-block lookup latency, Redis bytes per
indexed block — in process (MemoryIndex) and into a real redis-server (RedisIndex).

Starts its own redis-server on 127.0.0.1 (free port, temp dir, no persistence) unless
``--redis URL`` is given. Three rounds, sides alternating within each round; the median
of the rounds is printed::

    python benchmarks/cluster_index.py
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from pagedkv import FullAttentionSpec
from pagedkv.cluster import CacheAware, IndexIngest, MemoryIndex, Replica, Router
from pagedkv.cluster.redis_index import RedisIndex, connect
from pagedkv.events import BlockRemoved, BlockStored, KVCacheEvent

SPEC = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)


def start_redis() -> tuple[subprocess.Popen[bytes], str, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install redis-server), or pass --redis")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    directory = tempfile.mkdtemp(prefix="pagedkv-bench-redis-")
    process = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly",
         "no", "--dir", directory], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(200):
        try:
            connect(url).ping()
            return process, url, directory
        except Exception:
            time.sleep(0.02)
    sys.exit("redis-server did not start")


def h(n: int) -> bytes:
    return n.to_bytes(32, "big")


def event_batches(num_batches: int, blocks_per_event: int, seed: int) -> list[list[KVCacheEvent]]:
    """Batches like an engine step's: a stored chain, and an eviction of an older one."""
    rng = random.Random(seed)
    batches: list[list[KVCacheEvent]] = []
    live: list[list[bytes]] = []
    next_hash = seed << 40
    for _ in range(num_batches):
        chain = [h(next_hash + i) for i in range(blocks_per_event)]
        next_hash += blocks_per_event
        batch: list[KVCacheEvent] = [BlockStored(chain, None, [0] * 16 * len(chain), 16, None,
                                                 "GPU", None, None, 0)]
        live.append(chain)
        if len(live) > 50:
            old = live.pop(rng.randrange(len(live)))
            batch.append(BlockRemoved(old, "GPU", 0))
        batches.append(batch)
    return batches


def ingest_rate(index_factory, batches: list[list[KVCacheEvent]]) -> float:
    index = index_factory()
    ingest = IndexIngest(index)
    t0 = time.perf_counter()
    for batch in batches:
        ingest.apply("pod-a", batch)
    elapsed = time.perf_counter() - t0
    assert not ingest.dirty
    return ingest.num_block_events / elapsed


def lookup_latencies(index, *, num_replicas: int, rounds: int) -> tuple[float, float]:
    """p50, p99 (µs) of Router.hit_tokens for a 512-block prompt that every replica
    holds a different prefix of (the longest: all 512)."""
    prompt = list(range(1, 513))
    for r in range(num_replicas):
        held = prompt[: 512 * (r + 1) // num_replicas]
        index.update(Replica(pod=f"pod-{r}"), added=[(0, x, "GPU") for x in held], removed=[])
    router = Router(index, specs=[SPEC], policy=CacheAware())
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        hits = router.hit_tokens(prompt, 512 * 16 + 1)
        times.append((time.perf_counter() - t0) * 1e6)
    assert hits[Replica(pod=f"pod-{num_replicas - 1}")] == 512 * 16
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.99)]


def redis_bytes_per_block(client, *, num_blocks: int, holders: int) -> float:
    client.flushall()
    index = RedisIndex(client, model="bench")
    before = client.info("memory")["used_memory"]
    refs = [(0, x, "GPU") for x in range(1, num_blocks + 1)]
    for r in range(holders):
        for start in range(0, num_blocks, 5000):
            index.update(Replica(pod=f"pod-{r}", dp_rank=0), added=refs[start:start + 5000],
                         removed=[])
    after = client.info("memory")["used_memory"]
    return (after - before) / num_blocks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis", default=None, help="use this server (it gets FLUSHALLed!)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--blocks-per-event", type=int, default=16)
    args = p.parse_args()
    process = None
    url = args.redis
    if url is None:
        process, url, directory = start_redis()
    client = connect(url, timeout_s=5.0)
    try:
        batches = event_batches(args.batches, args.blocks_per_event, seed=1)
        mem_rates, redis_rates = [], []
        for _ in range(args.rounds):
            client.flushall()
            mem_rates.append(ingest_rate(lambda: MemoryIndex(model="bench"), batches))
            client.flushall()
            redis_rates.append(ingest_rate(lambda: RedisIndex(client, model="bench"), batches))
        events = sum(len(b) for b in batches)
        blocks = sum(len(e.block_hashes) for b in batches for e in b)  # type: ignore[union-attr]
        print(f"ingest: {args.batches} batches, {events} events, {blocks} block events "
              f"({args.blocks_per_event} blocks per stored event), median of {args.rounds}")
        print(f"  in process (MemoryIndex):  {statistics.median(mem_rates):>10,.0f} block events/s"
              f"  = {statistics.median(mem_rates) * events / blocks:>9,.0f} events/s")
        redis_rate = statistics.median(redis_rates)
        print(f"  into Redis (EVALSHA/batch): {redis_rate:>10,.0f} block events/s"
              f"  = {statistics.median(redis_rates) * events / blocks:>9,.0f} events/s")
        for n in (3, 8):
            mem, red = [], []
            for _ in range(args.rounds):
                mem.append(lookup_latencies(MemoryIndex(model="bench"), num_replicas=n,
                                            rounds=300))
                client.flushall()
                red.append(lookup_latencies(RedisIndex(client, model="bench"), num_replicas=n,
                                            rounds=300))
            print(f"lookup, 512-block prompt, {n} replicas holding prefixes of it "
                  "(p50 / p99 microseconds, median of rounds):")
            print(f"  in process: {statistics.median(x[0] for x in mem):>8.0f} / "
                  f"{statistics.median(x[1] for x in mem):>8.0f}")
            print(f"  Redis (one EVALSHA): {statistics.median(x[0] for x in red):>8.0f} / "
                  f"{statistics.median(x[1] for x in red):>8.0f}")
        for holders in (1, 3):
            per = redis_bytes_per_block(client, num_blocks=100_000, holders=holders)
            print(f"Redis memory: {per:.0f} bytes per indexed block, {holders} replica(s) "
                  f"holding each of 100,000 blocks (forward + reverse sets, used_memory delta)")
        client.flushall()
    finally:
        client.close()
        if process is not None:
            process.kill()
            process.wait()
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
