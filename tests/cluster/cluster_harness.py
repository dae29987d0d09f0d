"""In-process replicas publishing on real ZeroMQ sockets (127.0.0.1) and an index
service following them: step, converge, and compare the router with each replica."""

from __future__ import annotations

import random
import time

from cluster_engines import SharedPrefixEngine, model_specs, shared_prefixes

from pagedkv.cluster import CacheAware, Replica, Router
from pagedkv.cluster.service import IndexService, SourceSpec
from pagedkv.events import KVEventsConfig


def probe_prompts(seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for prefix in shared_prefixes():
        for cut in (len(prefix), len(prefix) // 2):
            out.append(prefix[:cut] + [rng.randrange(1000) for _ in range(rng.randint(0, 9))])
    return out


class Cluster:
    """``engines[pod]`` publish on 127.0.0.1 (free ports), or with ``ipc_dir`` on ipc://
    paths there (fixed names, so a restarted engine binds the same endpoints)."""

    def __init__(self, index, num: int = 3, *, replay: bool = True, ipc_dir=None,
                 **config) -> None:
        self.index = index
        service_options = config.pop("service", {})
        self.config = config
        self.replay = replay
        self.ipc_dir = ipc_dir
        self.engines = {f"pod{i}": self._engine(f"pod{i}", seed=i) for i in range(num)}
        sources = []
        for pod, engine in self.engines.items():
            publisher = engine.mgr.publisher
            sources.append(SourceSpec(pod=pod, endpoint=publisher.last_endpoint,
                                      replay_endpoint=publisher.last_replay_endpoint))
        self.service = IndexService(index, sources, request_timeout_s=0.3,
                                    heal_every_s=0.05, **service_options)
        self.router = Router(index, specs=model_specs(False), policy=CacheAware())
        self.settle()

    def settle(self, seconds: float = 0.3) -> None:
        """Poll for a while: ZeroMQ connects asynchronously, and batches published before
        a subscriber is connected never reach it."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for engine in self.engines.values():
                engine.mgr.publish_events()
            self.service.step(0.01)

    def _engine(self, pod: str, seed: int) -> SharedPrefixEngine:
        if self.ipc_dir is None:
            pub = rep = "tcp://127.0.0.1:*"
        else:
            pub, rep = f"ipc://{self.ipc_dir}/{pod}.pub", f"ipc://{self.ipc_dir}/{pod}.rep"
        kv = KVEventsConfig(endpoint=pub, replay_endpoint=rep if self.replay else None,
                            topic=f"kv@{pod}@toy-model", **self.config)
        return SharedPrefixEngine(seed, kv_events=kv)

    def restart(self, pod: str, seed: int) -> None:
        assert self.ipc_dir is not None, "a restart needs fixed endpoints (ipc_dir)"
        self.engines[pod].mgr.close()
        self.engines[pod] = self._engine(pod, seed)

    def replica(self, pod: str) -> Replica:
        return Replica(pod=pod, dp_rank=0)

    def pump(self, steps: int, *, poll: bool = True) -> None:
        for _ in range(steps):
            for engine in self.engines.values():
                engine.step()
                engine.mgr.publish_events()
            if poll:
                self.service.step(0)

    def expected(self, prompt):
        hits, hashes = {}, None
        for pod, engine in self.engines.items():
            hit, hashes = engine.probe(prompt)
            if hit:
                hits[self.replica(pod)] = hit
        return hits, hashes

    def mismatches(self, *, at_most: bool = False) -> list:
        """Probes where the router differs from the replicas (or, with ``at_most``, where
        it claims more than a replica holds: a stale hit)."""
        bad = []
        for prompt in probe_prompts():
            want, hashes = self.expected(prompt)
            got = self.router.hit_tokens(hashes, len(prompt))
            if at_most:
                if any(n > want.get(r, 0) for r, n in got.items()):
                    bad.append((prompt[:3], got, want))
            elif got != want:
                bad.append((prompt[:3], got, want))
        return bad

    def converge(self, timeout_s: float = 15.0, *, repairs_done: bool = False) -> list:
        """Idle-step until the router agrees with every replica (and, with
        ``repairs_done``, no publisher has a replay or snapshot request outstanding: the
        index can agree before a repair that was asked for has come back)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for engine in self.engines.values():
                engine.mgr.publish_events()  # idle steps serve snapshot requests
            self.service.step(0.01)
            bad = self.mismatches()
            pending = repairs_done and any(
                self.service.subscriber.status(p).repairing for p in self.engines)
            if (not bad and not pending) or time.monotonic() > deadline:
                return bad

    def close(self) -> None:
        self.service.close()
        for engine in self.engines.values():
            engine.mgr.close()
