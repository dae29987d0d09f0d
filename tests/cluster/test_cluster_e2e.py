"""End to end: three publisher processes running real managers on a shared-prefix
workload, ``pagedkv index serve`` into a real Redis, and the router's answers equal to
each replica's own get_computed_blocks, also after an eviction storm."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_engines import model_specs
from cluster_harness import probe_prompts

from pagedkv.cluster import CacheAware, Replica, Router

pytest.importorskip("zmq")

ENGINE = Path(__file__).with_name("cluster_engines.py")


class Publisher:
    def __init__(self, pod: str, seed: int) -> None:
        self.pod = pod
        self.process = subprocess.Popen(
            [sys.executable, str(ENGINE), pod, str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        hello = json.loads(self.process.stdout.readline())
        self.endpoint, self.replay = hello["endpoint"], hello["replay"]

    def ask(self, **command):
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.process.stdin.close()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()


@pytest.fixture
def publishers():
    made = [Publisher(f"pod{i}", seed=i) for i in range(3)]
    yield made
    for p in made:
        p.close()


def router_mismatches(router, publishers):
    prompts = probe_prompts()
    answers = {p.pod: p.ask(cmd="probe", prompts=prompts) for p in publishers}
    bad, hits_seen = [], 0
    for i, prompt in enumerate(prompts):
        want = {Replica(pod=pod, dp_rank=0): a["hits"][i]
                for pod, a in answers.items() if a["hits"][i]}
        hashes = answers[publishers[0].pod]["hashes"][i]
        assert all(a["hashes"][i] == hashes for a in answers.values())  # one hashing
        got = router.hit_tokens(hashes, len(prompt))
        hits_seen += len(want)
        if got != want:
            bad.append((i, got, want))
    return bad, hits_seen


def converge(router, publishers, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        bad, hits_seen = router_mismatches(router, publishers)
        if not bad or time.monotonic() > deadline:
            return bad, hits_seen
        time.sleep(0.05)


def test_index_service_router_equals_each_replica(redis_server, publishers, tmp_path):
    from pagedkv.cluster.redis_index import RedisIndex, connect

    log = (tmp_path / "serve.log").open("w+")
    serve = subprocess.Popen(
        [sys.executable, "-m", "pagedkv", "index", "serve", "--redis", redis_server.url,
         "--model", "toy-model", "--status-every", "0.5", "--request-timeout", "0.5",
         *[arg for p in publishers
           for arg in ("--subscribe", f"{p.pod}={p.endpoint},replay={p.replay}")]],
        stderr=log,
    )
    index = RedisIndex(connect(redis_server.url), model="toy-model")
    router = Router(index, specs=model_specs(False), policy=CacheAware())
    try:
        for p in publishers:
            assert p.ask(cmd="steps", n=60)["ok"]
        bad, hits_seen = converge(router, publishers)
        assert bad == [] and hits_seen > 5
        storm = [p.ask(cmd="storm")["evicted"] for p in publishers]
        assert min(storm) >= 96 - 1  # every replica turned its whole pool over
        for p in publishers:
            p.ask(cmd="steps", n=30)
        bad, hits_seen = converge(router, publishers)
        assert bad == [] and hits_seen > 5
        assert {r.state for r in index.replicas().values()} == {"synced"}
        for attempt in range(20):  # the service may still be writing: wait for quiet
            try:
                index.check_invariants()
                break
            except AssertionError:
                if attempt == 19:
                    raise
                time.sleep(0.1)
        time.sleep(0.6)  # one status line at least
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(10) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
        index.close()
    log.seek(0)
    text = log.read()
    assert "Traceback" not in text
    status = [line for line in text.splitlines() if line.startswith("index toy-model:")]
    assert status and "3 publishers (3 synced)" in status[-1] and "index ok" in status[-1]
