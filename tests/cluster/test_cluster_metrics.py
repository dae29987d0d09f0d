"""``pagedkv index serve --metrics-port``: the index service's Prometheus metrics, scraped
over real HTTP on 127.0.0.1 and parsed with prometheus_client's text parser, against a
real redis-server and a real ZeroMQ publisher."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from cluster_engines import SharedPrefixEngine

from pagedkv.cluster import MemoryIndex
from pagedkv.cluster.index_metrics import IndexServiceExporter
from pagedkv.cluster.service import IndexService, SourceSpec
from pagedkv.events import KVEventsConfig

pytest.importorskip("zmq")


def scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def engine() -> SharedPrefixEngine:
    return SharedPrefixEngine(3, kv_events=KVEventsConfig(
        endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*"))


def test_exporter_reports_the_service_figures() -> None:
    e = engine()
    index = MemoryIndex(model="m")
    service = IndexService(index, [SourceSpec(pod="p0", endpoint=e.mgr.publisher.last_endpoint,
                                              replay_endpoint=e.mgr.publisher.last_replay_endpoint)],
                           request_timeout_s=0.3)
    exporter = IndexServiceExporter(min_interval_s=3600)
    port = exporter.serve(0)
    try:
        assert scrape(port) == {}  # nothing taken yet
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for _ in range(5):
                e.step()
            e.mgr.publish_events()
            service.step(0.01)
            if service.ingest.num_batches > 5 and service.stats().publishers[0].synced:
                break
        exporter.update(service)
        exporter.update(service)  # too soon: the figures stay as they were
        stats = service.stats()
        m = scrape(port)
        label = "{pod=p0,publisher=p0}"
        assert m["pagedkv_index_publishers"] == 1 == m["pagedkv_index_publishers_synced"]
        assert m["pagedkv_index_blocks" + label] == stats.publishers[0].blocks > 0
        assert m["pagedkv_index_blocks" + label] == len(index.blocks_of(
            service.ingest.replica("p0")))
        assert m["pagedkv_index_batches_ingested_total"] == stats.batches > 5
        assert m["pagedkv_index_block_events_ingested_total"] == stats.block_events
        assert m["pagedkv_index_gaps_total" + label] == 0
        assert m["pagedkv_index_available"] == 1
        for _ in range(20):
            e.step()
        e.mgr.publish_events()
        service.step(0.2)
        assert scrape(port) == m  # min_interval_s: not taken again
        exporter.update(service, force=True)
        assert scrape(port)["pagedkv_index_batches_ingested_total"] > stats.batches
    finally:
        exporter.close()
        service.close()
        e.mgr.close()


def test_cli_serve_metrics_port_zero(redis_server) -> None:
    e = engine()
    pub = e.mgr.publisher
    serve = subprocess.Popen(
        [sys.executable, "-m", "pagedkv", "index", "serve", "--redis", redis_server.url,
         "--model", "m", "--status-every", "0.5", "--request-timeout", "0.5",
         "--metrics-port", "0",
         "--subscribe", f"pod-a={pub.last_endpoint},replay={pub.last_replay_endpoint}"],
        stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stderr is not None
        lines = [serve.stderr.readline(), serve.stderr.readline()]
        line = next((x for x in lines if x.startswith("metrics: serving")), None)
        assert line is not None, lines
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        deadline = time.monotonic() + 20
        m: dict[str, float] = {}
        while time.monotonic() < deadline:
            for _ in range(5):
                e.step()
            e.mgr.publish_events()
            time.sleep(0.1)
            m = scrape(port)
            if m.get("pagedkv_index_batches_ingested_total", 0) > 5 and m.get(
                    "pagedkv_index_publishers_synced") == 1:
                break
        label = "{pod=pod-a,publisher=pod-a}"
        assert m["pagedkv_index_publishers"] == 1 and m["pagedkv_index_publishers_synced"] == 1
        assert m["pagedkv_index_blocks" + label] > 0
        assert m["pagedkv_index_block_events_ingested_total"] > 0
        assert m["pagedkv_index_available"] == 1
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(10) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
        serve.communicate(timeout=10)
        e.mgr.close()


def test_cli_serve_metrics_errors_are_one_line(redis_server) -> None:
    def serve(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pagedkv", "index", "serve", "--redis", redis_server.url,
             "--subscribe", "tcp://127.0.0.1:1", "--max-seconds", "0.1", *extra],
            capture_output=True, text=True, timeout=60)

    bad = serve("--metrics-port", "70000")
    assert bad.returncode == 2 and "--metrics-port must be in [0, 65535]" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = serve("--metrics-port", str(s.getsockname()[1]))
    assert taken.returncode == 2 and "cannot listen on 127.0.0.1" in taken.stderr
    assert "Traceback" not in taken.stderr
