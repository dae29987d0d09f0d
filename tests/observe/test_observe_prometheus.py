"""The exporter over real HTTP on 127.0.0.1, parsed with the Prometheus text parser."""

from __future__ import annotations

import urllib.request

import pytest
from observe_support import Clock, compute, full, observed
from prometheus_client.parser import text_string_to_metric_families

from pagedkv import KVCacheManager
from pagedkv.observe import ObserveConfig
from pagedkv.observe.prometheus import PrometheusExporter


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_scrape_over_http_after_a_small_workload() -> None:
    clock = Clock()
    mgr = observed([full(16)], num_blocks=6,
                   observe=ObserveConfig(clock=clock, residency_sample_every=1))
    exporter = PrometheusExporter()
    port = exporter.serve(0)
    try:
        a = mgr.new_request("a", list(range(40)))
        compute(mgr, a)          # 40 queried, 0 hit: 32 never seen, 8 partial
        mgr.free(a)
        clock.now = 1.0
        b = mgr.new_request("b", list(range(40)))
        compute(mgr, b)          # 32 hit
        mgr.free(b)
        clock.now = 3.0
        compute(mgr, mgr.new_request("c", list(range(900, 980))))  # 80 never seen, evicts all
        b.num_preemptions = 1
        mgr.get_computed_blocks(b)   # a preempted re-lookup, counted apart
        exporter.record(mgr)
        m = scrape(port)
    finally:
        exporter.close()
    assert m["pagedkv_prefix_cache_queries_total"][()] == 160
    assert m["pagedkv_prefix_cache_hits_total"][()] == 32
    assert m["pagedkv_prefix_cache_requests_total"][()] == 3
    assert m["pagedkv_prefix_cache_preempted_queries_total"][()] == 40
    assert m["pagedkv_kv_cache_usage_perc"][()] == pytest.approx(mgr.usage)
    assert m["pagedkv_kv_cache_evicted_blocks_total"][()] == mgr.num_evicted_blocks > 0
    missed = m["pagedkv_prefix_cache_missed_tokens_total"]
    assert missed == {(("reason", "never_seen"),): 32 + 80, (("reason", "partial_block"),): 16}
    pre = m["pagedkv_prefix_cache_preempted_missed_tokens_total"]
    assert pre == {(("reason", "evicted"),): 32, (("reason", "partial_block"),): 8}
    # Every followed block that is allocated again ends a life (vLLM's definition): a's
    # partial block 3 when b reuses it, then 3, 2 and 1 when c takes the whole pool.
    assert m["pagedkv_kv_block_lifetime_seconds_count"][()] == 4
    # Blocks 1 and 2: born at 0, hit at 1.0, evicted at 3.0; block 3 twice lived 1 / 2 s.
    assert m["pagedkv_kv_block_lifetime_seconds_sum"][()] == pytest.approx(3 + 3 + 1 + 2)
    assert m["pagedkv_kv_block_idle_before_evict_seconds_sum"][()] == pytest.approx(2 + 2 + 1 + 2)
    assert m["pagedkv_kv_block_reuse_gap_seconds_count"][()] == 0
    assert m["pagedkv_kv_events_dropped_batches_total"][()] == 0


def test_plain_manager_without_attribution_is_exported_too() -> None:
    mgr = KVCacheManager.from_spec(full(16), num_blocks=8, max_model_len=256)
    r = mgr.new_request("a", list(range(20)))
    mgr.allocate_slots(r, 20, new_computed_blocks=mgr.get_computed_blocks(r))
    exporter = PrometheusExporter(namespace="engine")
    exporter.record(mgr)
    names = {f.name for f in text_string_to_metric_families(exporter.text())}
    assert {"engine_prefix_cache_queries", "engine_kv_cache_usage_perc"} <= names
    assert "engine_prefix_cache_missed_tokens" in names  # declared, no samples yet
