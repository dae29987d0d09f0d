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

from pagedkv.cluster.replicas import PolicyResult, ReplicaReport
from pagedkv.errors import require

__all__ = ["plot_replica_reports", "render_replica_report", "replica_report_json"]


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render_replica_report(report: ReplicaReport) -> str:
    """The comparison table, with the setup and the step-time model stated.

    One row per policy: hit rate, TTFT p50/p99, queueing p50/p99 (arrival to first
    step), requests per replica (min-max), load imbalance (max/mean prefill tokens
    computed per replica), mean KV usage over replicas, preemptions."""
    e = report.engine
    st = e.step_time
    lines = [
        f"{report.workload}: {report.num_requests:,} requests over "
        f"{_replicas(report.num_replicas)}, each {e.num_blocks - 1:,} blocks = "
        f"{(e.num_blocks - 1) * e.block_size:,} tokens of KV cache (block size "
        f"{e.block_size}), budget {e.token_budget:,} tokens/step, max {e.max_running} running",
        f"step time = {st.step_overhead_s * 1e3:g} ms + {st.prefill_token_s * 1e6:g} us x "
        f"prefill tokens + {st.decode_seq_s * 1e3:g} ms x decoding seqs; cache-aware cost = "
        f"{report.weights.prefill_token:g} x (uncovered + queued prefill tokens) + "
        f"{report.weights.decode_seq:g} x running seqs",
        "",
        f"{'policy':<14}{'hit rate':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'queue p50':>10}"
        f"{'queue p99':>10}{'req/replica':>14}{'imbalance':>10}{'KV usage':>9}{'preempt':>8}",
    ]
    for r in report.results:
        spread = f"{min(r.requests_per_replica)}-{max(r.requests_per_replica)}"
        usage = sum(r.mean_usage_per_replica) / len(r.mean_usage_per_replica)
        lines.append(
            f"{r.policy:<14}{r.hit_rate:>8.1%} {_s(r.ttft_p50_s):>9}s{_s(r.ttft_p99_s):>9}s"
            f"{_s(r.queue_p50_s):>9}s{_s(r.queue_p99_s):>9}s{spread:>14}"
            f"{r.load_imbalance:>10.2f}{usage:>9.1%}{r.num_preemptions:>8,}"
        )
    rejected = max((r.num_rejected for r in report.results), default=0)
    if rejected:
        lines.append(f"rejected (longer than a replica's cache): {rejected:,} requests")
    return "\n".join(lines)


def _replicas(n: int) -> str:
    """``1 replica``, ``3 replicas``."""
    return f"{n} replica" if n == 1 else f"{n} replicas"


def replica_report_json(report: ReplicaReport) -> dict[str, Any]:
    """The report as plain JSON-able data."""
    data: dict[str, Any] = dataclasses.asdict(report)
    return data


def plot_replica_reports(reports: Sequence[ReplicaReport], path: str | Path) -> Path:
    """Hit rate and TTFT p50/p99 per policy, one group of bars per cluster size."""
    matplotlib: Any = require("matplotlib", "plot", "multi-replica plots")
    matplotlib.use("Agg")
    plt: Any = require("matplotlib.pyplot", "plot", "multi-replica plots")
    policies: list[str] = []
    for report in reports:
        for r in report.results:
            if r.policy not in policies:
                policies.append(r.policy)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    width = 0.8 / max(len(policies), 1)
    panels: list[tuple[str, Callable[[PolicyResult], float]]] = [
        ("hit rate (%)", lambda r: 100 * r.hit_rate),
        ("TTFT p50 (s)", lambda r: r.ttft_p50_s or 0.0),
        ("TTFT p99 (s)", lambda r: r.ttft_p99_s or 0.0),
    ]
    for ax, (title, value) in zip(axes, panels, strict=True):
        for k, policy in enumerate(policies):
            xs, ys = [], []
            for x, report in enumerate(reports):
                found: list[PolicyResult] = [r for r in report.results if r.policy == policy]
                if found:
                    xs.append(x + (k - (len(policies) - 1) / 2) * width)
                    ys.append(value(found[0]))
            ax.bar(xs, ys, width=width, label=policy)
        ax.set_xticks(range(len(reports)))
        ax.set_xticklabels([_replicas(r.num_replicas) for r in reports])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{reports[0].workload}: router policies" if reports else "router policies")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
