"""The index service and the ``pagedkv index`` CLI: DP ranks, parsing, errors, query."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from cluster_engines import SharedPrefixEngine

from pagedkv.cluster import MemoryIndex, Replica
from pagedkv.cluster.service import IndexService, SourceSpec, parse_source
from pagedkv.errors import InvalidArgumentError
from pagedkv.events import KVEventsConfig

pytest.importorskip("zmq")


def test_parse_source():
    assert parse_source("p=tcp://127.0.0.1:1,replay=tcp://127.0.0.1:2") == SourceSpec(
        pod="p", endpoint="tcp://127.0.0.1:1", replay_endpoint="tcp://127.0.0.1:2")
    assert parse_source("tcp://127.0.0.1:1").pod == "127.0.0.1:1"
    for bad in ("p=1234", "tcp://h:1,replica=tcp://h:2", "a|b=tcp://h:1"):
        with pytest.raises(InvalidArgumentError):
            parse_source(bad)


def test_dp_ranks_of_one_pod_are_separate_replicas():
    engines = [
        SharedPrefixEngine(rank, kv_events=KVEventsConfig(
            endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
            data_parallel_rank=rank))
        for rank in (0, 1)
    ]
    index = MemoryIndex(model="m")
    sources = [SourceSpec(pod="vllm-0", endpoint=e.mgr.publisher.last_endpoint,
                          replay_endpoint=e.mgr.publisher.last_replay_endpoint)
               for e in engines]
    service = IndexService(index, sources, request_timeout_s=0.3)
    try:
        deadline = time.monotonic() + 5
        want = {Replica(pod="vllm-0", dp_rank=0), Replica(pod="vllm-0", dp_rank=1)}
        while time.monotonic() < deadline:
            for e in engines:
                e.step()
                e.mgr.publish_events()
            service.step(0.01)
            if set(index.replicas()) == want and all(s.num_blocks for s in
                                                     index.replicas().values()):
                break
        assert set(index.replicas()) == want
        for rank, publisher_id in enumerate(("vllm-0", "vllm-0#1")):
            blocks = index.blocks_of(Replica(pod="vllm-0", dp_rank=rank))
            assert blocks == service.ingest.expected_blocks(publisher_id) != set()
        service.ingest.check_invariants()
        assert "2 publishers" in service.status_line()
        with pytest.raises(InvalidArgumentError, match="twice"):
            IndexService(index, [sources[0], sources[0]])
    finally:
        service.close()
        for e in engines:
            e.mgr.close()


def cli(*args):
    return subprocess.run([sys.executable, "-m", "pagedkv", "index", *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_errors_are_one_line(redis_server):
    down = "redis://127.0.0.1:1/0"
    cases = [
        (cli("query", "--redis", down, "--hashes", "1,2"), 1, "unreachable"),
        (cli("query", "--redis", "nope://x", "--hashes", "1"), 2, "bad Redis URL"),
        (cli("serve", "--redis", redis_server.url, "--subscribe", "foo"), 2, "expected"),
        (cli("query", "--redis", redis_server.url, "--hashes", "x"), 2, "integers"),
        (cli("query", "--redis", redis_server.url, "--tokens", "@/nonexistent"), 1,
         "/nonexistent"),
        (cli("query", "--redis", redis_server.url, "--hashes", "1", "--group", "sliding"), 2,
         "--group"),
        (cli("query", "--redis", redis_server.url), 2, "required"),
    ]
    for result, code, text in cases:
        assert result.returncode == code, result
        assert text in result.stderr and "Traceback" not in result.stderr, result.stderr
        if code == 1:
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_cli_query_answers_the_longest_prefix(redis_server):
    from pagedkv import BlockHasher, Request
    from pagedkv.cluster.redis_index import RedisIndex, connect
    from pagedkv.events.wire import wire_hash

    tokens = list(range(40))
    hashes = [wire_hash(x) for x in
              Request("q", tokens, hasher=BlockHasher(16)).block_hashes]  # 2 full blocks
    index = RedisIndex(connect(redis_server.url), model="m")
    index.update(Replica(pod="a", dp_rank=0), added=[(0, hashes[0], "GPU")], removed=[])
    index.update(Replica(pod="b", dp_rank=0), added=[(0, x, "GPU") for x in hashes],
                 removed=[])
    out = cli("query", "--redis", redis_server.url, "--model", "m", "--json",
              "--tokens", ",".join(map(str, tokens)))
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["best"] == "b|0"
    assert {r["replica"]: r["hit_tokens"] for r in answer["replicas"]} == {"b|0": 32, "a|0": 16}
    text = cli("query", "--redis", redis_server.url, "--model", "m",
               "--hashes", ",".join(hex(x) for x in hashes[:1]))
    assert text.returncode == 0 and "best: " in text.stdout
    index.close()
