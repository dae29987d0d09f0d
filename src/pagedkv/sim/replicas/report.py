"""Render a multi-replica comparison: a text table, JSON, and a PNG plot.

``render_replica_report(report)`` is the table ``pagedkv simulate --replicas N --router
compare`` prints; ``plot_replica_reports(reports, path)`` draws hit rate and TTFT per
policy for one or more cluster sizes (needs the ``plot`` extra).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pagedkv.errors import require
from pagedkv.sim.replicas.merge import PolicyResult, ReplicaReport

__all__ = ["plot_replica_reports", "render_replica_report", "replica_report_json"]


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def render_replica_report(report: ReplicaReport) -> str:
    """The comparison table: per policy the hit rate, TTFT mean/p50/p99, TPOT mean/p99,
    E2E mean/p99, output tokens/s, requests per replica (min-max), load imbalance (max
    over mean uncached prompt tokens per replica), mean KV usage and preemptions."""
    lines = [
        f"{report.workload}: {report.num_requests:,} requests over "
        f"{_replicas(report.num_replicas)}, each the engine `pagedkv simulate` runs "
        f"(same capacity, scheduler and clock); cache-aware cost = "
        f"{report.weights.prefill_token:g} x (uncovered + queued prefill tokens) + "
        f"{report.weights.decode_seq:g} x running seqs",
        "",
        f"{'policy':<14}{'hit rate':>9}{'TTFT mean':>10}{'p50':>8}{'p99':>9}"
        f"{'TPOT mean':>10}{'p99':>7}{'E2E mean':>9}{'p99':>9}{'out tok/s':>10}"
        f"{'req/replica':>13}{'imbalance':>10}{'KV usage':>9}{'preempt':>8}",
        f"{'':<14}{'':>9}{'s':>10}{'s':>8}{'s':>9}{'ms':>10}{'ms':>7}{'s':>9}{'s':>9}",
    ]
    for r in report.results:
        spread = f"{min(r.requests_per_replica)}-{max(r.requests_per_replica)}"
        usage = "-" if r.usage_mean is None else f"{r.usage_mean:.1%}"
        tps = "-" if r.output_tokens_per_s is None else f"{r.output_tokens_per_s:,.0f}"
        lines.append(
            f"{r.policy:<14}{r.hit_rate:>9.1%}{_s(r.ttft.mean):>10}{_s(r.ttft.p50):>8}"
            f"{_s(r.ttft.p99):>9}{_ms(r.tpot.mean):>10}{_ms(r.tpot.p99):>7}"
            f"{_s(r.e2e.mean):>9}{_s(r.e2e.p99):>9}{tps:>10}{spread:>13}"
            f"{r.load_imbalance:>10.2f}{usage:>9}{r.num_preemptions:>8,}")
    rejected = max((r.num_rejected for r in report.results), default=0)
    if rejected:
        lines.append(f"rejected (longer than a replica's cache): {rejected:,} requests")
    return "\n".join(lines)


def _replicas(n: int) -> str:
    """``1 replica``, ``3 replicas``."""
    return f"{n} replica" if n == 1 else f"{n} replicas"


def replica_report_json(report: ReplicaReport) -> dict[str, Any]:
    """The report as plain JSON-able data (each result without its full ``report``)."""
    results = []
    for r in report.results:
        row = {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "report"}
        for name in ("ttft", "tpot", "e2e", "queue_delay"):
            row[name] = dataclasses.asdict(row[name])
        results.append(row)
    return {"workload": report.workload, "num_requests": report.num_requests,
            "num_replicas": report.num_replicas,
            "weights": dataclasses.asdict(report.weights), "results": results}


def plot_replica_reports(reports: Sequence[ReplicaReport], path: str | Path, *,
                         title: str = "") -> Path:
    """Hit rate and TTFT p50/p99 per policy, one group of bars per cluster size, each bar
    labelled with its value; the legend below the panels (clear of the bars); ``title``
    (model, GPU, ...) under the workload in the heading."""
    matplotlib: Any = require("matplotlib", "plot", "multi-replica plots")
    matplotlib.use("Agg")
    plt: Any = require("matplotlib.pyplot", "plot", "multi-replica plots")
    from pagedkv.sim.plots import save_figure
    policies: list[str] = []
    for report in reports:
        for r in report.results:
            if r.policy not in policies:
                policies.append(r.policy)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    width = 0.8 / max(len(policies), 1)
    panels: list[tuple[str, Callable[[PolicyResult], float]]] = [
        ("hit rate (%)", lambda r: 100 * r.hit_rate),
        ("TTFT p50 (s)", lambda r: r.ttft.p50 or 0.0),
        ("TTFT p99 (s)", lambda r: r.ttft.p99 or 0.0),
    ]
    for ax, (panel, value) in zip(axes, panels, strict=True):
        for k, policy in enumerate(policies):
            xs, ys = [], []
            for x, report in enumerate(reports):
                found = [r for r in report.results if r.policy == policy]
                if found:
                    xs.append(x + (k - (len(policies) - 1) / 2) * width)
                    ys.append(value(found[0]))
            bars = ax.bar(xs, ys, width=width, label=policy)
            ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
        ax.set_xticks(range(len(reports)))
        ax.set_xticklabels([_replicas(r.num_replicas) for r in reports])
        ax.set_title(panel)
        ax.margins(y=0.15)  # room above the tallest bar for its label
        ax.grid(axis="y", alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=max(len(names), 1), fontsize=9,
               title="router policy", title_fontsize=9)
    heading = f"{reports[0].workload}: router policies" if reports else "router policies"
    fig.suptitle(heading + (f"\n{title}" if title else ""), fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return save_figure(fig, path)
