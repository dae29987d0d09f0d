"""A toy engine over the real KVCacheManager on a shared-prefix workload, usable in process
or as a publisher process driven over stdin/stdout (one JSON object per line).

As a process: ``python cluster_engines.py POD SEED [hybrid]`` binds a PUB and a ROUTER
socket on 127.0.0.1 (free ports), prints ``{"endpoint": ..., "replay": ...}``, publishes
one batch per engine step, and publishes (empty) batches while idle so snapshot requests
are answered. Commands: ``{"cmd": "steps", "n": N}``, ``{"cmd": "storm"}`` (an eviction
storm: unique prompts until every cached block has been replaced), ``{"cmd": "probe",
"prompts": [[token, ...], ...]}`` (answers each prompt's ``get_computed_blocks`` hit and
its wire hashes), ``{"cmd": "quit"}``. Every answer is one JSON line.
"""

from __future__ import annotations

import json
import queue
import random
import socket
import sys
import threading

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager, SlidingWindowSpec
from pagedkv.events import KVEventsConfig
from pagedkv.events.wire import wire_hash

BLOCK_SIZE = 4
SPEC = {"block_size": BLOCK_SIZE, "num_kv_heads": 2, "head_size": 8, "dtype_bytes": 2}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model_specs(hybrid: bool) -> tuple:
    if hybrid:
        return (FullAttentionSpec(**SPEC), SlidingWindowSpec(sliding_window=8, **SPEC))
    return (FullAttentionSpec(**SPEC),)


def shared_prefixes(seed: int = 99, count: int = 4) -> list[list[int]]:
    """System prompts every replica sees (the same for all processes)."""
    rng = random.Random(seed)
    return [[rng.randrange(1000) for _ in range(rng.randint(12, 40))] for _ in range(count)]


class SharedPrefixEngine:
    """Admit prompts = shared prefix + random suffix, decode, finish, preempt."""

    def __init__(self, seed: int, *, hybrid: bool = False, num_blocks: int = 96,
                 kv_events: KVEventsConfig | None = None) -> None:
        self.rng = random.Random(seed)
        self.mgr = KVCacheManager(CacheConfig(
            groups=model_specs(hybrid), num_blocks=num_blocks, max_model_len=512,
            enable_events=True, kv_events=kv_events,
        ))
        self.prefixes = shared_prefixes()
        self.running: dict[str, object] = {}
        self.num_admitted = 0

    def admit(self, prompt: list[int]) -> None:
        request = self.mgr.new_request(f"r{self.num_admitted}", prompt)
        self.num_admitted += 1
        hit = self.mgr.get_computed_blocks(request)
        if self.mgr.allocate_slots(
            request, len(prompt) - hit.num_computed_tokens, new_computed_blocks=hit
        ) is None:
            return
        request.num_computed_tokens = len(prompt)
        self.running[request.request_id] = request

    def step(self) -> None:
        rng = self.rng
        if rng.random() < 0.7:
            self.admit(list(rng.choice(self.prefixes))
                       + [rng.randrange(1000) for _ in range(rng.randint(1, 16))])
        for request in list(self.running.values()):
            if request.num_tokens >= 120 or rng.random() < 0.15:
                self.mgr.free(request)
                del self.running[request.request_id]
                continue
            request.append_output_tokens([rng.randrange(1000)])
            if self.mgr.allocate_slots(request, 1) is None:
                self.mgr.free(request)
                del self.running[request.request_id]
            else:
                request.num_computed_tokens += 1

    def storm(self) -> None:
        """Unique long prompts, each finished at once, until the pool has turned over."""
        for request in list(self.running.values()):
            self.mgr.free(request)
        self.running.clear()
        start = self.mgr.num_evicted_blocks
        total = self.mgr.num_free_blocks
        while self.mgr.num_evicted_blocks - start < total:
            prompt = [self.rng.randrange(1000, 2000) for _ in range(60)]
            self.admit(prompt)
            for request in list(self.running.values()):
                self.mgr.free(request)
            self.running.clear()

    def probe(self, prompt: list[int]) -> tuple[int, list[int]]:
        request = self.mgr.new_request("probe", prompt)
        hit = self.mgr.get_computed_blocks(request)
        return hit.num_computed_tokens, [wire_hash(h) for h in request.block_hashes]


def _serve(pod: str, seed: int, hybrid: bool) -> None:
    config = KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                            topic=f"kv@{pod}@toy-model", buffer_steps=64)
    engine = SharedPrefixEngine(seed, hybrid=hybrid, kv_events=config)
    publisher = engine.mgr.publisher
    assert publisher is not None
    print(json.dumps({"endpoint": publisher.last_endpoint,
                      "replay": publisher.last_replay_endpoint}), flush=True)
    commands: queue.Queue[dict | None] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            commands.put(json.loads(line))
        commands.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            command = commands.get(timeout=0.01)
        except queue.Empty:
            engine.mgr.publish_events()  # idle: serve snapshot requests
            continue
        if command is None or command["cmd"] == "quit":
            break
        if command["cmd"] == "steps":
            for _ in range(command["n"]):
                engine.step()
                engine.mgr.publish_events()
            answer: dict = {"ok": True, "evicted": engine.mgr.num_evicted_blocks}
        elif command["cmd"] == "storm":
            engine.storm()
            engine.mgr.publish_events()
            answer = {"ok": True, "evicted": engine.mgr.num_evicted_blocks}
        else:
            probes = [engine.probe(p) for p in command["prompts"]]
            answer = {"hits": [h for h, _ in probes], "hashes": [w for _, w in probes]}
        engine.mgr.check_invariants()
        print(json.dumps(answer), flush=True)
    engine.mgr.close()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "hybrid")
