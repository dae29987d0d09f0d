"""``pagedkv simulate --explain-misses`` and ``--metrics-port``: the miss breakdown of an
engine replay (table, reading, plot, JSON), its agreement with the simulator's own hit
accounting, Prometheus scrapes over real HTTP on 127.0.0.1, and the errors."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pagedkv.cli import main
from pagedkv.sim import SimConfig, run
from pagedkv.sim.generators import GENERATORS
from pagedkv.sim.observe_engine import ReplayObserver
from pagedkv.sim.workloads import Workload

#: Chat sessions on a small pool: evictions, blocked admissions, preemptions (a second).
SMALL = ["simulate", "--generator", "multi-turn", "--sessions", "30", "--turns", "4",
         "--num-blocks", "200", "--no-progress", "--no-bounds"]


def small_workload() -> Workload:
    return GENERATORS["multi-turn"](num_conversations=30, num_turns=4)


SMALL_CONFIG = SimConfig(num_blocks=200, bounds=False, jobs=1)


def scrape(port: int) -> dict[str, float]:
    """GET /metrics on 127.0.0.1 and parse it with Prometheus' text parser:
    ``{"name{label=value}": value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def test_explain_misses_prints_table_reading_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*SMALL, "--explain-misses", "--plot-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    section = out[out.index("Missed prompt tokens by reason"):]
    for row in ("never_seen", "evicted", "total missed", "hit"):
        assert f"\n{row} " in section, section
    assert "% of prompt tokens missed:" in section
    assert "evictions of blocks that came back within" in section
    plot = tmp_path / "missed_tokens_by_reason.png"
    assert plot.stat().st_size > 5000
    assert f"missed tokens by reason over time: {plot.resolve()}" in out


def test_explain_misses_json_agrees_with_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*SMALL, "--explain-misses", "--json", "--no-plots"])
    assert code == 0
    s = json.loads(capsys.readouterr().out)
    m = s["miss_breakdown"]
    assert m["hit_tokens"] == s["hit_tokens"]
    assert m["queried_tokens"] == s["prompt_tokens"]
    assert m["queried_tokens"] == m["hit_tokens"] + sum(m["missed_tokens"].values())
    assert m["missed_tokens"]["evicted"] > 0 and s["preemptions"] > 0
    assert sum(i["hit_tokens"] for i in m["intervals"]) == m["hit_tokens"]
    assert 0 <= m["eviction_gap_s_p50"] <= m["eviction_gap_s_p90"]


def test_observed_replay_changes_nothing_and_stamps_simulated_time() -> None:
    wl = small_workload()
    cfg = SMALL_CONFIG
    plain = run(wl, cfg)
    obs = ReplayObserver(ghost_entries=1_000_000)
    observed = run(wl, cfg, observer=obs)
    assert observed.result is not None and plain.result is not None
    assert observed.result.hit_tokens == plain.result.hit_tokens
    assert observed.result.finish_s == plain.result.finish_s
    assert observed.evicted_blocks == plain.evicted_blocks
    b = obs.breakdown()
    assert b.total.hits == plain.hit_tokens and b.forgotten_evictions == 0
    end = plain.result.sim_duration_s
    assert b.series[-1][0] == pytest.approx(end) and len(b.series) == 40
    assert b.eviction_gaps and all(0 <= gap <= end for gap, _ in b.eviction_gaps)
    # A ghost record too small to remember them: evictions read never_seen, and it says so.
    small = ReplayObserver(ghost_entries=100)
    run(wl, cfg, observer=small)
    sb = small.breakdown()
    assert sb.forgotten_evictions > 0
    assert sb.total.missed_tokens.get("evicted", 0) < b.total.missed_tokens["evicted"]
    assert "raise --ghost-entries" in sb.interpretation()


def test_metrics_scraped_during_the_replay() -> None:
    """The library path: the exporter serves while the replay runs; the scrape happens in
    the progress callback (mid-replay and at its end)."""
    from pagedkv.observe.prometheus import PrometheusExporter

    exporter = PrometheusExporter()
    port = exporter.serve(0)
    scrapes: list[dict[str, float]] = []
    try:
        obs = ReplayObserver(exporter=exporter, residency_sample_every=10)
        report = run(small_workload(), SMALL_CONFIG, observer=obs,
                     progress=lambda done, total: scrapes.append(scrape(port)))
        obs.breakdown()
        scrapes.append(scrape(port))
    finally:
        exporter.close()
    assert len(scrapes) >= 3
    first, last = scrapes[0], scrapes[-1]
    q = "pagedkv_prefix_cache_queries_total"
    assert 0 < first[q] < last[q]
    assert last["pagedkv_prefix_cache_hits_total"] >= report.hit_tokens
    missed = {k: v for k, v in last.items()
              if k.startswith("pagedkv_prefix_cache_missed_tokens_total{")}
    assert "pagedkv_prefix_cache_missed_tokens_total{reason=evicted}" in missed
    assert last[q] == last["pagedkv_prefix_cache_hits_total"] + sum(missed.values())
    assert last["pagedkv_kv_cache_evicted_blocks_total"] == report.evicted_blocks
    assert 0 <= last["pagedkv_kv_cache_usage_perc"] <= 1
    assert last["pagedkv_kv_block_lifetime_seconds_count"] > 0


def test_cli_metrics_port_zero_prints_the_port_and_serves_after_the_replay() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedkv", *SMALL, "--no-plots", "--metrics-port", "0",
         "--metrics-linger-s", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith("metrics: serving http://127.0.0.1:"), first
        port = int(first.rsplit(":", 1)[1].split("/")[0])
        done = proc.stderr.readline()
        assert done.startswith("metrics: replay done"), done
        metrics = scrape(port)
        assert metrics["pagedkv_prefix_cache_queries_total"] > 0
        assert metrics["pagedkv_prefix_cache_missed_tokens_total{reason=never_seen}"] > 0
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--explain-misses", "--mode", "pure-cache"], "use it with --mode engine"),
        (["--metrics-port", "70000"], "--metrics-port must be in [0, 65535]"),
        (["--metrics-linger-s", "5"], "--metrics-linger-s goes with --metrics-port"),
        (["--explain-misses", "--ghost-entries", "-1"], "--ghost-entries must be >= 0"),
    ],
)
def test_flag_errors_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*SMALL, "--no-plots", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_metrics_port_without_prometheus_client_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    code = main([*SMALL, "--no-plots", "--metrics-port", "0"])
    err = capsys.readouterr().err
    assert code == 1 and "pip install 'pagedkv[metrics]'" in err
    assert len(err.strip().splitlines()) == 1


def test_metrics_port_taken_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code = main([*SMALL, "--no-plots", "--metrics-port", str(port)])
    err: Any = capsys.readouterr().err
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err
