"""Faults: Redis killed and restarted mid-ingest, batches dropped, a publisher restarted,
a subscriber that falls behind, a gap nobody can repair, AllBlocksCleared."""

from __future__ import annotations

import logging
import time

import pytest
from cluster_harness import Cluster

from pagedkv.cluster import IndexIngest, MemoryIndex, Replica, ReplicaLoad
from pagedkv.events import AllBlocksCleared, BlockStored

pytest.importorskip("zmq")


@pytest.fixture
def redis_index(redis_server):
    from pagedkv.cluster.redis_index import RedisIndex, connect

    index = RedisIndex(connect(redis_server.url), model="toy-model")
    yield index
    index.close()


@pytest.fixture
def make_cluster():
    made = []

    def make(index, **kwargs):
        cluster = Cluster(index, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def test_redis_killed_and_restarted_mid_ingest(redis_server, redis_index, make_cluster, caplog):
    cluster = make_cluster(redis_index)
    cluster.pump(30)
    assert cluster.converge() == []
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="pagedkv.cluster"):
        cluster.pump(40)  # ingest keeps counting; writes fail
        # The ingest learns that Redis is gone at its first Redis call: a batch's write or,
        # if every batch came and went before a heal was due, the next heal (every 0.05 s).
        # Step until that call has happened; the deadline only bounds a hang.
        deadline = time.monotonic() + 15
        while not cluster.service.ingest.dirty and time.monotonic() < deadline:
            cluster.service.step(0.01)
        assert cluster.service.ingest.dirty
        loads = {cluster.replica(p): ReplicaLoad() for p in cluster.engines}
        decision = cluster.router.route([1, 2], num_tokens=9, loads=loads)
        assert decision.degraded and decision.policy == "least-loaded"
        assert "UNAVAILABLE" in cluster.service.status_line()
    redis_server.start()  # back, empty
    cluster.pump(20)
    assert cluster.converge() == []  # rewritten from the ingest's counts
    assert not cluster.service.ingest.dirty
    cluster.service.ingest.check_invariants()
    redis_index.check_invariants()
    decision = cluster.router.route([1, 2], num_tokens=9, loads=loads)
    assert not decision.degraded
    # A restart between two writes: no write fails, the registry shows the loss.
    redis_server.stop()
    redis_server.start()
    assert cluster.converge() == []
    assert not cluster.service.ingest.dirty


def test_dropped_batches_are_repaired(redis_index, make_cluster):
    # A queue of one batch: publishing faster than the sender thread drops batches,
    # which still take their sequence numbers (a gap); the buffer cannot replay them.
    cluster = make_cluster(redis_index, max_queue_size=1)
    cluster.pump(150)
    dropped = sum(e.mgr.publisher.stats.num_dropped_batches for e in cluster.engines.values())
    assert dropped > 0
    # Under load a snapshot request can go unanswered past its retries: the source then
    # skips ahead (unsynced, its replica's entries stale until the next snapshot) and
    # asks again once live batches show the engine stepping. So step until repaired,
    # synced and agreeing; the deadline only bounds a hang.
    deadline = time.monotonic() + 90
    while True:
        bad = cluster.converge(repairs_done=True)
        statuses = [cluster.service.subscriber.status(p) for p in cluster.engines]
        repaired = sum(s.num_snapshots for s in statuses) > len(statuses)  # beyond the first
        synced = all(s.synced for s in statuses)
        if (not bad and repaired and synced) or time.monotonic() > deadline:
            break
        cluster.pump(5)
    assert bad == []
    assert sum(s.num_gaps for s in statuses) > 0
    assert repaired and all(s.synced for s in statuses), statuses
    cluster.service.ingest.check_invariants()


def test_publisher_restart_clears_its_old_entries(redis_index, make_cluster, tmp_path):
    cluster = make_cluster(redis_index, ipc_dir=tmp_path)
    cluster.pump(40)
    assert cluster.converge() == []
    old = len(redis_index.blocks_of(cluster.replica("pod1")))
    assert old > 0
    cluster.restart("pod1", seed=42)  # a new engine, empty cache, sequence from 0
    cluster.settle()  # ZeroMQ reconnects the subscriber meanwhile
    cluster.pump(5)
    assert cluster.converge() == []
    now = redis_index.blocks_of(cluster.replica("pod1"))
    assert now == cluster.service.ingest.expected_blocks("pod1")
    redis_index.check_invariants()


def test_slow_subscriber_has_bounded_memory_and_catches_up(redis_index, make_cluster,
                                                            tmp_path):
    # ipc:// (a Unix socket) has a fixed kernel buffer: past it and the high-water
    # marks, ZeroMQ drops instead of queueing without bound.
    cluster = make_cluster(redis_index, num=1, ipc_dir=tmp_path, hwm=20,
                           service={"rcvhwm": 20})
    assert cluster.converge() == []
    engine = cluster.engines["pod0"]
    for _ in range(100):  # nobody reads
        engine.storm()  # a large batch (~5 KB)
        engine.mgr.publish_events()
        cluster.pump(2, poll=False)
    cluster.pump(5)  # batches after the lost ones show the gap
    assert cluster.converge() == []
    assert cluster.service.subscriber.num_lost_batches("pod0") > 0  # dropped and counted
    cluster.service.ingest.check_invariants()


def test_unrepairable_gap_clears_and_never_serves_stale(redis_index, make_cluster,
                                                        monkeypatch):
    cluster = make_cluster(redis_index, replay=False)
    cluster.pump(30)
    assert cluster.converge() == []
    for engine in cluster.engines.values():
        # The eviction storm's batch is lost (a full queue drops it, its number spent);
        # without a replay socket nothing can repair the gap.
        engine.storm()
        monkeypatch.setattr(engine.mgr.publisher, "_max_queue_size", 0)
        engine.mgr.publish_events()
        monkeypatch.undo()
        assert engine.mgr.publisher.stats.num_dropped_batches == 1
    cluster.pump(10)  # later batches show the gap
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        cluster.service.step(0.01)
        states = redis_index.replicas()
        if {s.state for s in states.values()} == {"rebuilding"}:
            break
    assert {s.state for s in states.values()} == {"rebuilding"}, states
    assert cluster.mismatches(at_most=True) == []  # never more than a replica holds
    cluster.service.ingest.check_invariants()


def test_all_blocks_cleared_clears_the_replica():
    index = MemoryIndex(model="m")
    ingest = IndexIngest(index)
    stored = BlockStored([b"\x00" * 24 + bytes([0] * 7 + [9])], None, [1, 2], 2, None, "GPU",
                         None, None, 0)
    ingest.apply("a", [stored, stored])
    ingest.apply("b", [stored])
    assert index.longest_prefix(0, [9]) == {Replica(pod="a"): 1, Replica(pod="b"): 1}
    ingest.apply("a", [AllBlocksCleared()])
    assert index.longest_prefix(0, [9]) == {Replica(pod="b"): 1}
    ingest.apply("a", [stored])  # counting restarts from zero after the clear
    assert ingest.num_blocks("a") == 1
    ingest.check_invariants()
    index.check_invariants()
