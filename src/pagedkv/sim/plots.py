"""PNG plots of a :class:`~pagedkv.sim.summary.SimReport` (``matplotlib``, optional).

``hit_rate_usage.png``: the hit rate per time window (markers, drawn on top) beside the
overall rate and the Belady / infinite ceilings, on an axis scaled to the data with every
ceiling visible; in engine mode a second panel, sharing the same time axis, with KV usage
and the running / waiting requests, its legend outside the curves.
``hit_rate_vs_capacity.png`` (with a sweep): LRU, Belady and infinite, each a colour, solid
over all requests and dashed after warm-up; the unlimited point at the right edge; the
simulated capacity marked.
``latency.png`` (engine mode): the distributions of per-request TTFT, TPOT and end-to-end
latency, titled with the clock that timed them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pagedkv.errors import InputFileError, require
from pagedkv.sim.summary import SimReport

__all__ = ["check_plot_dir", "plot_files", "write_plots"]

_COLORS = {"lru": "tab:blue", "belady": "tab:orange", "infinite": "tab:gray",
           "achieved": "tab:blue", "ideal": "tab:green"}


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110) -> Path:
    """Save ``fig`` to ``path`` (its folder made if needed), close it; returns the path."""
    import matplotlib.pyplot as plt

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def human_label(code: str) -> str:
    """A reason or policy code as a reader says it: ``never_seen`` -> ``never seen``."""
    return code.replace("_", " ").replace("-", " ") if "_" in code else code


def mark_percentiles(ax: Any, sorted_values: list[float]) -> None:
    """p50 and p99 of a CDF as dashed lines with their values written beside them."""
    if not sorted_values:
        return
    n = len(sorted_values)
    for share, colour in ((0.50, "tab:green"), (0.99, "tab:red")):
        value = sorted_values[min(n - 1, max(0, int(share * n + 0.5) - 1))]
        ax.axvline(value, color=colour, ls="--", lw=0.9)
        ax.annotate(f"p{round(share * 100)} {value:.3g}", (value, share),
                    textcoords="offset points", xytext=(4, -12 if share > 0.9 else 4),
                    fontsize=8, color=colour)


def check_plot_dir(plot_dir: str | Path) -> Path:
    """Create ``plot_dir`` if needed and check it is writable — before a long replay.

    Raises:
        InputFileError: it cannot be created or written.
    """
    out = Path(plot_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".pagedkv-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise InputFileError(str(out), f"plot directory not writable ({exc.strerror or exc});"
                             " choose another --plot-dir or --no-plots") from None
    return out


def plot_files(report: SimReport, plot_dir: str | Path) -> list[Path]:
    """The files :func:`write_plots` writes for ``report``."""
    names = ["hit_rate_usage.png"] + (["hit_rate_vs_capacity.png"] if report.sweep else [])
    if report.engine is not None and report.result is not None:
        names.append("latency.png")
    return [Path(plot_dir) / n for n in names]


def write_plots(report: SimReport, plot_dir: str | Path) -> list[Path]:
    """Write the PNG plots (module docstring) into ``plot_dir``; returns their paths.

    Raises:
        MissingDependencyError: matplotlib is not installed (``pip install
            'pagedkv[plot]'``).
        InputFileError: the directory is not writable.
    """
    require("matplotlib", "plot", "writing PNG plots")
    import matplotlib

    matplotlib.use("Agg")
    out_dir = check_plot_dir(plot_dir)
    s = report.to_dict()
    # the second title line: the clock names model, TP and GPU; without one, the capacity
    capacity = (s.get("settings") or {}).get("capacity") or {}
    clock = str((report.clock or {}).get("description", "")
                or (f"capacity: {capacity['source']}" if capacity.get("source") else ""))
    written = [_hit_rate_usage(s, out_dir / "hit_rate_usage.png", clock=clock)]
    if s.get("capacity_sweep"):
        written.append(_capacity(s, out_dir / "hit_rate_vs_capacity.png"))
    if report.engine is not None and report.result is not None:
        written.append(_latency(report, out_dir / "latency.png"))
    return written


def _latency(report: SimReport, path: Path) -> Path:
    """Per-request TTFT, TPOT and end-to-end latency as distributions (engine mode),
    titled with the clock that timed them."""
    import matplotlib.pyplot as plt

    res = report.result
    assert res is not None
    outs = res.output_tokens or [1] * len(res.finish_s)
    ttft, tpot, e2e = [], [], []
    for a, first, end, n in zip(res.arrival_s, res.first_token_s, res.finish_s, outs,
                                strict=True):
        if first is not None:
            ttft.append(first - a)
        if end is not None and first is not None:
            e2e.append(end - a)
            if n > 1:
                tpot.append(1e3 * (end - first) / (n - 1))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, values, label in ((axes[0], ttft, "TTFT (s)"), (axes[1], tpot, "TPOT (ms)"),
                              (axes[2], e2e, "end-to-end (s)")):
        xs = sorted(values)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))])
        mark_percentiles(ax, xs)
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
    clock = (report.clock or {}).get("description", "")
    workload = report.to_dict().get("workload", "")
    fig.suptitle(f"{workload}: per-request latency (CDF, p50/p99 marked)\nclock {clock}",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


def _hit_rate_usage(s: dict[str, Any], path: Path, *, clock: str = "") -> Path:
    import matplotlib.pyplot as plt

    engine = s["mode"] == "engine"
    fig, axes = plt.subplots(2 if engine else 1, 1, figsize=(9, 7 if engine else 4.6),
                             squeeze=False, sharex=True)
    ax = axes[0][0]
    xlabel = "simulated time (s)" if engine else "trace arrival time (s)"
    values: list[float] = []
    for key, label, style, color in (
        ("infinite_cache_hit_rate", "infinite cache", ":", _COLORS["infinite"]),
        ("belady_hit_rate", "Belady at this capacity", "--", _COLORS["belady"]),
        ("ideal_hit_rate", "analytic ideal", "-.", _COLORS["ideal"]),
        ("hit_rate", "achieved, overall", "-", "black"),
    ):
        if s.get(key) is not None:
            v = 100 * s[key]
            values.append(v)
            ax.axhline(v, linestyle=style, color=color, linewidth=1.2, zorder=1,
                       label=f"{label}: {v:.1f} %")
    windows = s["hit_rate_windows"]
    if windows:
        xs = [(w["start_s"] + w["end_s"]) / 2 for w in windows]
        ys = [100 * w["hit_rate"] for w in windows]
        values.extend(ys)
        ax.plot(xs, ys, "o-", color=_COLORS["achieved"], markersize=4, linewidth=1.5,
                zorder=3, label="achieved, per window")
    top = max(values, default=1.0)
    ax.set_ylim(0, min(100.0, max(2.0, top * 1.25)))
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.04 if engine else -0.16),
              ncol=3, frameon=False)
    ax.set_title(f"{s['workload']}: {s['mode']}, block {s['block_size']}, "
                 f"{s['capacity_tokens']:,} tokens" + (f"\n{clock}" if clock else ""),
                 fontsize=10)
    if not engine:
        ax.set_xlabel(xlabel)
    else:
        ax2 = axes[1][0]
        samples = s["usage_over_time"]
        ts = [p["time_s"] for p in samples]
        lines = ax2.plot(ts, [100 * p["usage"] for p in samples], color="tab:purple",
                         drawstyle="steps-post", label="KV usage (%)")
        ax2.set_ylabel("KV usage (%)")
        ax2.set_ylim(0, 105)
        ax2.set_xlabel(xlabel)
        ax3 = ax2.twinx()
        lines += ax3.plot(ts, [p["running"] for p in samples], color="tab:green",
                          linewidth=0.9, drawstyle="steps-post", label="running requests")
        lines += ax3.plot(ts, [p["waiting"] for p in samples], color="tab:red",
                          linewidth=0.9, drawstyle="steps-post", label="waiting requests")
        ax3.set_ylabel("requests")
        ax3.set_ylim(bottom=0)
        ax2.legend(lines, [str(ln.get_label()) for ln in lines], fontsize=8,
                   loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)


def _capacity(s: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    sweep = s["capacity_sweep"]
    finite = [r for r in sweep if r["capacity_tokens"] is not None]
    unlimited = next((r for r in sweep if r["capacity_tokens"] is None), None)
    caps = [r["capacity_tokens"] for r in finite]
    right = max(caps, default=1) * 4
    xs = caps + ([right] if unlimited else [])
    rows = finite + ([unlimited] if unlimited else [])
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    for key, label, marker in (("lru", "LRU (pagedkv)", "o"), ("belady", "Belady", "s"),
                               ("infinite", "infinite cache", "")):
        color = _COLORS[key]
        for suffix, style, what in (("", "-", "all requests"),
                                    ("_after_warmup", "--", "after warm-up")):
            ax.plot(xs, [100 * r[key + suffix] for r in rows], marker + style, color=color,
                    markersize=4, label=f"{label}, {what}")
    cap = s["capacity_tokens"]
    ax.axvline(cap, color="black", linewidth=0.8, linestyle="-.")
    ax.annotate(f"simulated: {cap:,} tokens", (cap, 2), rotation=90, fontsize=7,
                ha="right", va="bottom")
    ax.set_xscale("log")
    if unlimited:
        ticks = [t for t in ax.get_xticks() if min(xs) <= t < right / 2]
        ax.set_xticks([*ticks, right])
        ax.set_xticklabels([f"{t:.0e}".replace("e+0", "e") for t in ticks] + ["unlimited"])
    ax.set_xlabel("cache capacity (tokens)")
    ax.set_ylabel("prefix-cache hit rate (%)")
    top = max(100 * max(r["infinite"], r["infinite_after_warmup"]) for r in rows)
    ax.set_ylim(0, min(100.0, max(2.0, top * 1.15)))
    ax.set_title(f"{s['workload']}: hit rate vs capacity, block {s['block_size']}, "
                 f"pure-cache mode ({s['semantics']} semantics)", fontsize=10)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14),
              frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)
