"""``pagedkv simulate --replicas N --router ...`` runs the cluster replica comparison."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

GEN = ["--generator", "system-prompts", "--groups", "2", "--per-group", "4",
       "--num-blocks", "500", "--no-plots", "--no-progress"]


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pagedkv", "simulate", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_replicas_compare_json_has_every_policy() -> None:
    p = _sim(*GEN, "--replicas", "2", "--router", "compare", "--json")
    assert p.returncode == 0, p.stderr
    text = json.dumps(json.loads(p.stdout))
    for policy in ("round-robin", "least-loaded", "cache-aware"):
        assert policy in text


def test_replicas_bad_values_are_one_line() -> None:
    p = _sim(*GEN, "--replicas", "0")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    p = _sim(*GEN, "--router", "cache-aware")
    assert p.returncode == 2 and "--replicas" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("feature", [[], ["--host-memory", "8GiB"], ["--explain-misses"]],
                         ids=["device-only", "host-tier", "explain-misses"])
def test_one_replica_equals_the_single_engine(feature: list[str]) -> None:
    # The bundled default (its first 300 requests, the planner's capacity, the roofline
    # clock): --replicas 1 --router round-robin is the same replay, every figure equal,
    # with a feature too (each replica's engine gets it as simulate's does)
    trace = ["--limit", "300", "--no-plots", "--no-progress", "--no-bounds", "--json",
             *feature]
    one = _sim(*trace)
    rep = _sim(*trace, "--replicas", "1", "--router", "round-robin")
    assert one.returncode == 0 and rep.returncode == 0, (one.stderr, rep.stderr)
    engine = json.loads(one.stdout)
    (result,) = json.loads(rep.stdout)["results"]
    assert engine["preemptions"] > 0
    if "--host-memory" in feature:  # the tier is used: blocks come back from host memory
        assert engine["host_tier"]["loads"] > 0
    if "--explain-misses" in feature:  # the same misses by reason, interval by interval
        assert engine["miss_breakdown"]["missed_tokens"]["evicted"] > 0
        assert result["miss_breakdown"] == engine["miss_breakdown"]
        assert result["miss_breakdown_per_replica"] == [engine["miss_breakdown"]]
    assert result["num_preemptions"] == engine["preemptions"]
    assert result["num_rejected"] == engine["rejected_requests"]
    assert result["hit_rate"] == engine["hit_rate"]
    assert (result["usage_mean"], result["usage_max"]) == (engine["usage_mean"],
                                                           engine["usage_max"])
    assert result["output_tokens_per_s"] == engine["output_tokens_per_s"]
    latency = engine["latency_s"]
    for name, key in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s"),
                      ("queue_delay", "queue_delay_s")):
        assert result[name] == latency[key], name
        assert set(result[name]) == {"mean", "p50", "p90", "p99"}


def test_one_replica_table_wording() -> None:
    p = _sim(*GEN, "--replicas", "1", "--router", "round-robin")
    assert p.returncode == 0, p.stderr
    assert "over 1 replica, each the engine" in p.stdout and "1 replicas" not in p.stdout
    assert "TTFT mean" in p.stdout


def test_replicas_refuse_what_one_engine_owns() -> None:
    # a host-memory sweep compares sizes on one engine: one line
    p = _sim(*GEN, "--replicas", "2", "--host-memory", "1GiB,2GiB")
    assert p.returncode == 2 and "one size" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_miss_attribution_sums_the_replicas() -> None:
    # two replicas: the summed breakdown is the sum of the per-replica ones, per policy
    p = _sim(*GEN, "--replicas", "2", "--router", "compare", "--explain-misses", "--json")
    assert p.returncode == 0, p.stderr
    for r in json.loads(p.stdout)["results"]:
        total, parts = r["miss_breakdown"], r["miss_breakdown_per_replica"]
        assert len(parts) == 2 and all(x["queried_tokens"] > 0 for x in parts)
        for key in ("queried_tokens", "hit_tokens"):
            assert total[key] == sum(x[key] for x in parts)
        for reason, n in total["missed_tokens"].items():
            assert n == sum(x["missed_tokens"].get(reason, 0) for x in parts)
    text = _sim(*GEN, "--replicas", "2", "--router", "cache-aware", "--explain-misses")
    assert "Missed prompt tokens by reason (cache-aware, summed over 2 replicas" in text.stdout


def test_replicas_publish_events_and_serve_metrics_from_the_cli() -> None:
    # the flags reach every replica's engine: the run publishes and serves, exit 0
    pytest.importorskip("zmq")
    pytest.importorskip("prometheus_client")
    p = _sim(*GEN, "--replicas", "2", "--router", "cache-aware",
             "--kv-events-endpoint", "tcp://127.0.0.1:*", "--metrics-port", "0")
    assert p.returncode == 0, p.stderr
    assert "metrics: serving http://127.0.0.1:" in p.stderr
    assert "cache-aware" in p.stdout
