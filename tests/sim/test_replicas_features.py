"""Every replica has ``simulate``'s features: KV events on the one ZeroMQ endpoint (each
batch tagged with its replica's data-parallel rank) and Prometheus metrics on one
endpoint (a ``replica`` label); one replica behind round-robin publishes and exports
exactly what ``simulate`` does. Real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from pagedkv.core.records import AllBlocksCleared, BlockRemoved, BlockStored
from pagedkv.events.config import KVEventsConfig
from pagedkv.sim import SimConfig, run, system_prompts
from pagedkv.sim.observe_cli import SimObserving
from pagedkv.sim.observe_replicas import ReplicaObserving
from pagedkv.sim.replicas import compare_policies, run_replicas
from pagedkv.sim.setup import ObserveOptions
from pagedkv.sim.workloads import Workload

CONFIG = SimConfig(num_blocks=300, jobs=1, bounds=False, block_size=16)


def workload() -> Workload:
    # 7 system prompts of 32 blocks on 300 blocks: evictions, so removals too
    return system_prompts(num_groups=7, questions_per_group=6, system_tokens=512,
                          question_tokens=40, output_tokens=60, interval_s=0.01)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def subscribed(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """An endpoint and a SUB socket connected to it; every publisher built on it waits,
    publishing probe batches, until the socket receives one (no slow-joiner loss)."""
    zmq = pytest.importorskip("zmq")
    pytest.importorskip("msgpack")
    from pagedkv.events import publisher as module

    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    real = module.ZmqEventPublisher

    class Synced(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            deadline = time.monotonic() + 10.0
            while not sub.poll(20):
                assert time.monotonic() < deadline, "the subscriber never connected"
                self.publish_as([AllBlocksCleared()], None)

    monkeypatch.setattr(module, "ZmqEventPublisher", Synced)
    try:
        yield endpoint, sub
    finally:
        sub.close(linger=0)
        ctx.term()


def _received(sub: Any) -> list[tuple[int, int | None, list[Any]]]:
    """Every ``(seq, rank, events)`` batch received until the socket is quiet, the probes
    (and what came before them) left out."""
    from pagedkv.events.wire import decode_batch, decode_seq

    out = []
    while sub.poll(500):
        _topic, seq, payload = sub.recv_multipart()
        batch = decode_batch(payload)
        out.append((decode_seq(seq), batch.data_parallel_rank, list(batch.events)))
    probes = [k for k, (_, rank, ev) in enumerate(out)
              if rank is None and ev == [AllBlocksCleared()]]
    return out[probes[-1] + 1:] if probes else out


def _events_config(endpoint: str) -> SimConfig:
    return replace(CONFIG, scheduler=replace(CONFIG.scheduler, kv_events=KVEventsConfig(
        endpoint=endpoint, replay_endpoint=None)))


def test_one_replica_publishes_what_simulate_publishes(subscribed):
    endpoint, sub = subscribed
    wl = workload()
    cfg = _events_config(endpoint)
    single = run(wl, cfg)
    by_simulate = _received(sub)
    one = run_replicas(wl, cfg, num_replicas=1, policy="round-robin")
    by_replica = _received(sub)
    assert single.preemptions == one.num_preemptions
    assert [b[1:] for b in by_replica] == [b[1:] for b in by_simulate]
    kinds = {type(e) for _, _, ev in by_simulate for e in ev}
    assert {BlockStored, BlockRemoved} <= kinds  # stores and evictions
    assert {rank for _, rank, _ in by_replica} == {0}


def test_every_replica_publishes_on_the_one_endpoint_under_its_rank(subscribed):
    endpoint, sub = subscribed
    result = run_replicas(workload(), _events_config(endpoint), num_replicas=3,
                          policy="round-robin")
    batches = _received(sub)
    assert result.requests_per_replica == (14, 14, 14)
    assert {rank for _, rank, _ in batches} == {0, 1, 2}
    seqs = [seq for seq, _, _ in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # one sequence, no gap
    for rank in range(3):  # each replica stores its own copy of the prompts it was given
        stored = [e for _, r, ev in batches if r == rank for e in ev
                  if isinstance(e, BlockStored)]
        assert stored


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Metric samples by name and labels, the replica/router labels and the creation
    timestamps left out."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k not in ("replica", "router")))
            out[(s.name, labels)] = s.value
    return out


def test_metrics_of_every_replica_on_one_endpoint():
    pytest.importorskip("prometheus_client")
    wl = workload()
    options = ObserveOptions(explain_misses=True, metrics_port=0)
    sim = SimObserving.start(options)
    assert sim is not None
    try:
        run(wl, CONFIG, observer=sim.observer)
        sim.breakdown()
        want = _samples(sim.exporter.text())
    finally:
        sim.close()
    reps = ReplicaObserving.start(options)
    assert reps is not None and reps.port is not None
    try:
        compare_policies(wl, CONFIG, num_replicas=1, policies=("round-robin",),
                         observers=reps.observers)
        compare_policies(wl, CONFIG, num_replicas=2, policies=("least-loaded",),
                         observers=reps.observers)
        reps.finish(plot_dir=None, json_mode=True, title="")  # the last intervals
    finally:
        reps.close()
    text = reps.metrics.text() if reps.metrics is not None else ""
    one = _samples("\n".join(line for line in text.splitlines()
                             if 'router="least-loaded"' not in line) + "\n")
    assert one == want  # one replica behind round-robin: simulate's figures
    assert want[("pagedkv_prefix_cache_hits_total", ())] > 0
    assert want[("pagedkv_kv_cache_evicted_blocks_total", ())] > 0
    assert 'replica="1",router="least-loaded"' in text
    # every request looked up once at admission, whichever replica admitted it
    assert reps.breakdown("least-loaded").total.queries == \
        reps.breakdown("round-robin").total.queries == sim.breakdown().total.queries


def test_the_endpoint_serves_on_loopback():
    pytest.importorskip("prometheus_client")
    reps = ReplicaObserving.start(ObserveOptions(metrics_port=0))
    assert reps is not None
    try:
        compare_policies(workload(), CONFIG, num_replicas=2, policies=("round-robin",),
                         observers=reps.observers)
        reps.breakdown("round-robin")  # the last interval
        body = urllib.request.urlopen(
            f"http://127.0.0.1:{reps.port}/metrics", timeout=10).read().decode()
    finally:
        reps.close()
    for k in (0, 1):
        assert f'pagedkv_prefix_cache_queries_total{{replica="{k}",router="round-robin"}}' \
            in body
