"""Reporting: one JSON-ready summary of a run, rendered as a terminal table (``rich`` when
installed, plain text otherwise), and PNG plots (``matplotlib``, optional).

:func:`summarize` builds the summary; :func:`render_text` / :func:`print_report` show it;
:func:`write_plots` draws it. :class:`ProgressReporter` is the progress bar for long runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pagedkv.errors import require
from pagedkv.sim.bounds import BoundResult
from pagedkv.sim.pure_cache import SweepRow
from pagedkv.sim.results import SimResult

__all__ = ["ProgressReporter", "print_report", "render_text", "summarize", "write_plots"]

#: Runs shorter than this show no progress bar.
PROGRESS_AFTER_S = 2.0


class ProgressReporter:
    """A progress bar that appears only once a phase has run ``PROGRESS_AFTER_S``
    seconds: ``rich`` when importable, else a ``\\r``-rewritten line on stderr.

    Call it as ``reporter(done, total)``; :meth:`phase` starts a new labelled phase;
    :meth:`close` clears it.
    """

    def __init__(self, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.label = ""
        self.t0 = time.monotonic()
        self._rich: Any = None
        self._task: Any = None
        self._last_plain = 0.0
        self._plain_shown = False

    def phase(self, label: str) -> None:
        self.close()
        self.label = label
        self.t0 = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or time.monotonic() - self.t0 < PROGRESS_AFTER_S:
            return
        if self._rich is None and self._task is None:
            try:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TimeElapsedColumn,
                )
            except ImportError:
                self._task = False
            else:
                self._rich = Progress(
                    "[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), transient=True,
                    console=_rich_console(self.stream),
                )
                self._rich.start()
                self._task = self._rich.add_task(self.label, total=total)
        if self._rich is not None:
            self._rich.update(self._task, completed=done, total=total)
            return
        now = time.monotonic()
        if now - self._last_plain >= 0.5 or done >= total:
            self._last_plain = now
            pct = 100.0 * done / total if total else 100.0
            self.stream.write(f"\r{self.label}: {done}/{total} ({pct:.0f}%)   ")
            self.stream.flush()
            self._plain_shown = True

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif self._plain_shown:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()
        self._rich = None
        self._task = None
        self._plain_shown = False


def _rich_console(stream: TextIO) -> Any:
    from rich.console import Console

    # Not a terminal (a pipe, a file): rich would wrap at 80 columns; lines here are wider.
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(file=stream) if tty else Console(file=stream, width=110)


# ---------------------------------------------------------------- summary


def _rate(hit: int, query: int) -> float | None:
    return hit / query if query else None


def summarize(
    result: SimResult,
    *,
    description: str,
    warmup_start: int,
    bounds_warmup_start: int | None = None,
    infinite: BoundResult | None = None,
    belady: BoundResult | None = None,
    ideal_hit_rate: float | None = None,
    sweep: Sequence[SweepRow] = (),
    settings: dict[str, Any] | None = None,
    num_windows: int = 20,
) -> dict[str, Any]:
    """Everything the report shows, as plain JSON-ready values (rates are fractions,
    times seconds). ``warmup_start``: index of the first request counted "after warm-up";
    ``bounds_warmup_start`` the same position in the bounds' request list (default the
    same index; differs when the bounds leave rejected requests out).
    """
    bw = warmup_start if bounds_warmup_start is None else bounds_warmup_start
    hit, query = result.totals()
    hit2, query2 = result.totals(warmup_start)
    out: dict[str, Any] = {
        "workload": result.workload,
        "description": description,
        "mode": result.mode,
        "block_size": result.block_size,
        "num_blocks": result.num_blocks,
        "capacity_tokens": result.capacity_tokens,
        "settings": settings or {},
        "requests": result.num_requests,
        "rejected_requests": result.rejected,
        "prompt_tokens": query,
        "hit_tokens": hit,
        "hit_rate": _rate(hit, query),
        "warmup_requests": warmup_start,
        "hit_rate_after_warmup": _rate(hit2, query2),
        "ideal_hit_rate": ideal_hit_rate,
        "infinite_cache_hit_rate": infinite.hit_rate() if infinite else None,
        "infinite_cache_hit_rate_after_warmup": (
            infinite.hit_rate(bw) if infinite else None
        ),
        "belady_hit_rate": belady.hit_rate() if belady else None,
        "belady_hit_rate_after_warmup": belady.hit_rate(bw) if belady else None,
        "evicted_blocks": result.evicted_blocks,
        "preemptions": result.preemptions,
        "preempted_relookup_tokens": result.preempted_query_tokens,
        "preempted_relookup_hit_tokens": result.preempted_hit_tokens,
        "hit_rate_windows": [
            {"start_s": a, "end_s": b, "hit_rate": r}
            for a, b, r in result.hit_rate_windows(num_windows)
        ],
        "wall_s": result.wall_s,
    }
    if result.mode == "engine":
        usage = result.sample_usage
        out.update({
            "steps": result.num_steps,
            "simulated_s": result.sim_duration_s,
            "usage_mean": sum(usage) / len(usage) if usage else None,
            "usage_max": max(usage) if usage else None,
            "latency_s": result.latency_percentiles(),
            "usage_over_time": [
                {"time_s": t, "usage": u, "running": r, "waiting": w}
                for t, u, r, w in zip(result.sample_time_s, usage, result.sample_running,
                                      result.sample_waiting, strict=True)
            ],
        })
    if sweep:
        out["capacity_sweep"] = [
            {
                "capacity_tokens": row.capacity_tokens, "num_blocks": row.num_blocks,
                "lru": row.lru, "lru_after_warmup": row.lru_after_warmup,
                "belady": row.belady, "belady_after_warmup": row.belady_after_warmup,
                "infinite": row.infinite, "infinite_after_warmup": row.infinite_after_warmup,
                "evicted_blocks": row.evicted_blocks,
            }
            for row in sweep
        ]
    return out


# ---------------------------------------------------------------- terminal


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _sec(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def _cap(tokens: int | None) -> str:
    return "unlimited" if tokens is None else f"{tokens:,}"


def _rows(s: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    cache = [
        ("hit rate (all requests)",
         f"{_pct(s['hit_rate'])}  ({s['hit_tokens']:,} of {s['prompt_tokens']:,} prompt "
         "tokens)"),
        (f"hit rate after warm-up (requests {s['warmup_requests']}+)",
         _pct(s["hit_rate_after_warmup"])),
    ]
    if s["belady_hit_rate"] is not None:
        cache.append(("Belady optimum at this capacity",
                      f"{_pct(s['belady_hit_rate'])}  (after warm-up "
                      f"{_pct(s['belady_hit_rate_after_warmup'])})"))
    if s["infinite_cache_hit_rate"] is not None:
        cache.append(("infinite-cache ceiling",
                      f"{_pct(s['infinite_cache_hit_rate'])}  (after warm-up "
                      f"{_pct(s['infinite_cache_hit_rate_after_warmup'])})"))
    if s["ideal_hit_rate"] is not None:
        cache.append(("analytic ideal (generator)", _pct(s["ideal_hit_rate"])))
    cache.append(("evicted blocks", f"{s['evicted_blocks']:,}"))
    windows = s["hit_rate_windows"]
    if windows:
        cache.append(("hit rate over time (windows)",
                      " ".join(f"{100 * w['hit_rate']:.0f}" for w in windows) + "  %"))
    sections = [("Prefix cache", cache)]
    if s["mode"] == "engine":
        lat = s["latency_s"]
        q, t = lat.get("queue_delay_s", {}), lat.get("ttft_s", {})
        sections.append(("Engine", [
            ("KV usage mean / max", f"{_pct(s['usage_mean'])} / {_pct(s['usage_max'])}"),
            ("steps / simulated time",
             f"{s['steps']:,} / {_sec(s['simulated_s'])}"),
            ("preemptions", f"{s['preemptions']:,}  (re-lookups hit "
                            f"{s['preempted_relookup_hit_tokens']:,} of "
                            f"{s['preempted_relookup_tokens']:,} tokens)"),
            ("rejected (longer than the cache)", f"{s['rejected_requests']:,}"),
            ("queue delay p50 / p90 / p99",
             " / ".join(_sec(q.get(k)) for k in ("p50", "p90", "p99"))),
            ("TTFT p50 / p90 / p99", " / ".join(_sec(t.get(k)) for k in ("p50", "p90", "p99"))),
        ]))
    return sections


def _header(s: dict[str, Any]) -> str:
    return (
        f"pagedkv simulate — {s['description']}\n"
        f"mode {s['mode']}, block size {s['block_size']}, {s['num_blocks'] - 1:,} blocks = "
        f"{s['capacity_tokens']:,} tokens of KV cache; replayed in {s['wall_s']:.1f} s"
    )


def _sweep_lines(s: dict[str, Any]) -> list[list[str]]:
    return [
        [_cap(r["capacity_tokens"]), _pct(r["lru"]), _pct(r["lru_after_warmup"]),
         _pct(r["belady"]), _pct(r["belady_after_warmup"]), _pct(r["infinite"]),
         _pct(r["infinite_after_warmup"])]
        for r in s.get("capacity_sweep", ())
    ]


_SWEEP_HEAD = ["capacity (tokens)", "LRU", "LRU after warm-up", "Belady",
               "Belady after warm-up", "infinite", "infinite after warm-up"]


def render_text(s: dict[str, Any]) -> str:
    """The report as plain text (no ``rich``)."""
    lines = [_header(s), ""]
    for title, rows in _rows(s):
        lines.append(title)
        width = max(len(k) for k, _ in rows)
        lines.extend(f"  {k.ljust(width)}  {v}" for k, v in rows)
        lines.append("")
    sweep = _sweep_lines(s)
    if sweep:
        lines.append("Hit rate vs capacity (pure-cache mode)")
        table = [_SWEEP_HEAD, *sweep]
        widths = [max(len(r[i]) for r in table) for i in range(len(_SWEEP_HEAD))]
        for r in table:
            lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def print_report(s: dict[str, Any], *, stream: TextIO | None = None, plain: bool = False) -> None:
    """Print the report: a ``rich`` table when importable (and not ``plain``), else text."""
    out = stream or sys.stdout
    if not plain:
        try:
            from rich.table import Table
        except ImportError:
            plain = True
    if plain:
        out.write(render_text(s))
        return
    console = _rich_console(out)
    console.print(_header(s), highlight=False)
    for title, rows in _rows(s):
        table = Table(title=title, title_justify="left", show_header=False, box=None,
                      padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for k, v in rows:
            table.add_row(k, v)
        console.print(table)
    sweep = _sweep_lines(s)
    if sweep:
        table = Table(title="Hit rate vs capacity (pure-cache mode)", title_justify="left")
        for h in _SWEEP_HEAD:
            table.add_column(h, justify="right")
        for r in sweep:
            table.add_row(*r)
        console.print(table)


# ---------------------------------------------------------------- plots


def write_plots(s: dict[str, Any], plot_dir: str | Path) -> list[Path]:
    """Write PNG plots of the summary into ``plot_dir`` (created if needed):
    ``hit_rate_usage.png`` (hit rate per window; KV usage, running and waiting requests
    over time in engine mode) and, with a sweep, ``hit_rate_vs_capacity.png``.

    Returns the paths written.

    Raises:
        MissingDependencyError: matplotlib is not installed (``pip install
            'pagedkv[plot]'``).
    """
    require("matplotlib", "plot", "writing PNG plots")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(plot_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    engine = s["mode"] == "engine"
    fig, axes = plt.subplots(2 if engine else 1, 1, figsize=(9, 6.5 if engine else 3.8),
                             squeeze=False)
    ax = axes[0][0]
    windows = s["hit_rate_windows"]
    if windows:
        xs = [(w["start_s"] + w["end_s"]) / 2 for w in windows]
        ax.step(xs, [100 * w["hit_rate"] for w in windows], where="mid",
                label="achieved (per window)")
    for key, label, style in (
        ("hit_rate", "achieved (overall)", "-"),
        ("belady_hit_rate", "Belady at this capacity", "--"),
        ("infinite_cache_hit_rate", "infinite cache", ":"),
        ("ideal_hit_rate", "analytic ideal", "-."),
    ):
        if s.get(key) is not None:
            ax.axhline(100 * s[key], linestyle=style, color="gray" if key != "hit_rate"
                       else "black", linewidth=1, label=f"{label}: {100 * s[key]:.1f} %")
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.set_xlabel("time (s)" + ("" if engine else ", trace arrival"))
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"{s['workload']}: {s['mode']}, block {s['block_size']}, "
                 f"{s['capacity_tokens']:,} tokens")
    if engine:
        ax2 = axes[1][0]
        samples = s["usage_over_time"]
        ts = [p["time_s"] for p in samples]
        ax2.plot(ts, [100 * p["usage"] for p in samples], label="KV usage (%)")
        ax2.set_ylabel("KV usage (%)")
        ax2.set_ylim(0, 105)
        ax2.set_xlabel("simulated time (s)")
        ax3 = ax2.twinx()
        ax3.plot(ts, [p["running"] for p in samples], color="tab:green", linewidth=0.8,
                 label="running")
        ax3.plot(ts, [p["waiting"] for p in samples], color="tab:red", linewidth=0.8,
                 label="waiting")
        ax3.set_ylabel("requests")
        lines = ax2.get_legend_handles_labels()
        more = ax3.get_legend_handles_labels()
        ax2.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    fig.tight_layout()
    path = out_dir / "hit_rate_usage.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    sweep = s.get("capacity_sweep")
    if sweep:
        finite = [r for r in sweep if r["capacity_tokens"] is not None]
        fig, ax = plt.subplots(figsize=(8, 4.5))
        caps = [r["capacity_tokens"] for r in finite]
        for key, label, style in (("lru", "LRU (pagedkv)", "o-"),
                                  ("lru_after_warmup", "LRU after warm-up", "o--"),
                                  ("belady", "Belady", "s-"),
                                  ("belady_after_warmup", "Belady after warm-up", "s--")):
            ax.plot(caps, [100 * r[key] for r in finite], style, label=label)
        ax.axhline(100 * sweep[0]["infinite"], color="gray", linestyle=":",
                   label=f"infinite: {100 * sweep[0]['infinite']:.1f} %")
        ax.set_xscale("log")
        ax.set_xlabel("cache capacity (tokens)")
        ax.set_ylabel("prefix-cache hit rate (%)")
        ax.set_ylim(0, 100)
        ax.set_title(f"{s['workload']}: hit rate vs capacity, block {s['block_size']}, "
                     "pure-cache mode")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / "hit_rate_vs_capacity.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
