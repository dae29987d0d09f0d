"""The cost / TTFT p99 trade-off of a sweep: its Pareto front, the cheapest point that
meets the SLO, a table and a plot (``matplotlib``, optional).

A row is on the **front** when no other row is at most as expensive with a lower TTFT
p99, or cheaper with at most its TTFT p99 (rows without a cost or a TTFT are left out).
The **cheapest point meeting the SLO** is the lowest ``usd_per_hour`` among rows with
``meets_slo``; ties go to the lower TTFT p99, then the lower point index.

>>> rows = [{"point": 0, "usd_per_hour": 3.0, "ttft_p99_s": 1.0, "meets_slo": True},
...         {"point": 1, "usd_per_hour": 6.0, "ttft_p99_s": 0.5, "meets_slo": True},
...         {"point": 2, "usd_per_hour": 6.0, "ttft_p99_s": 2.0, "meets_slo": False},
...         {"point": 3, "usd_per_hour": 1.5, "ttft_p99_s": 9.0, "meets_slo": False}]
>>> [r["point"] for r in pareto_front(rows)], cheapest_meeting_slo(rows)["point"]
([3, 0, 1], 0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pagedkv.errors import require
from pagedkv.sweep.rows import Slo

__all__ = ["cheapest_meeting_slo", "describe", "pareto_front", "pareto_table", "plot_pareto"]

Row = Mapping[str, Any]


def _plotted(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.get("usd_per_hour") is not None
            and r.get("ttft_p99_s") is not None]


def pareto_front(rows: Sequence[Row]) -> list[Row]:
    """The rows on the cost / TTFT p99 front, cheapest first (module docstring)."""
    ordered = sorted(_plotted(rows), key=lambda r: (r["usd_per_hour"], r["ttft_p99_s"],
                                                    r["point"]))
    front: list[Row] = []
    best = float("inf")
    for r in ordered:
        if r["ttft_p99_s"] < best:
            front.append(r)
            best = r["ttft_p99_s"]
    return front


def cheapest_meeting_slo(rows: Sequence[Row]) -> Row | None:
    """The cheapest row that meets the SLO, or None."""
    ok = [r for r in rows if r.get("meets_slo") and r.get("usd_per_hour") is not None]
    if not ok:
        return None
    return min(ok, key=lambda r: (r["usd_per_hour"], r["ttft_p99_s"], r["point"]))


def describe(row: Row, axes: Sequence[str]) -> str:
    """``gpu=H100-SXM tp=1 replicas=2`` for a row's axis values."""
    return " ".join(f"{a}={row.get(a)}" for a in axes)


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:,.0f} ms" if x < 1 else f"{x:,.2f} s"


def pareto_table(rows: Sequence[Row], axes: Sequence[str]) -> str:
    """The front as a text table: point, axis values, GPUs, $/h, TTFT and TPOT p99,
    SLO."""
    front = pareto_front(rows)
    head = ["point", *axes, "GPUs", "$/h", "TTFT p99", "TPOT p99", "SLO"]
    body = [[str(r["point"]), *(str(r.get(a)) for a in axes), str(r.get("gpus")),
             f"{r['usd_per_hour']:.2f}", _ms(r.get("ttft_p99_s")), _ms(r.get("tpot_p99_s")),
             "met" if r.get("meets_slo") else "missed"] for r in front]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def plot_pareto(rows: Sequence[Row], axes: Sequence[str], slo: Slo, path: str | Path, *,
                title: str = "") -> Path:
    """Write the cost / TTFT p99 scatter to ``path`` (PNG): every point (meeting the SLO
    or not), the front as a line, the TTFT target, the cheapest point meeting the SLO
    starred and labelled.

    Raises:
        MissingDependencyError: matplotlib is not installed (``pip install
            'pagedkv[plot]'``).
    """
    require("matplotlib", "plot", "writing the Pareto plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = _plotted(rows)
    front = pareto_front(rows)
    best = cheapest_meeting_slo(rows)
    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=110)
    for met, colour, label in ((True, "tab:green", "meets the SLO"),
                               (False, "tab:gray", "misses the SLO")):
        sel = [r for r in pts if bool(r.get("meets_slo")) is met]
        ax.scatter([r["usd_per_hour"] for r in sel], [r["ttft_p99_s"] for r in sel],
                   s=36, color=colour, alpha=0.75, label=f"{label} ({len(sel)})", zorder=2)
    ax.step([r["usd_per_hour"] for r in front], [r["ttft_p99_s"] for r in front],
            where="post", color="tab:orange", lw=2, zorder=3,
            label=f"Pareto front ({len(front)} points)")
    ax.scatter([r["usd_per_hour"] for r in front], [r["ttft_p99_s"] for r in front],
               s=70, facecolors="none", edgecolors="tab:orange", lw=2, zorder=4)
    ax.axhline(slo.ttft_p99_s, color="tab:red", ls="--", lw=1.2, zorder=1,
               label=f"SLO: TTFT p99 ≤ {slo.ttft_p99_s:g} s (and TPOT p99 ≤ "
                     f"{slo.tpot_p99_ms:g} ms)")
    if best is not None:
        ax.scatter([best["usd_per_hour"]], [best["ttft_p99_s"]], marker="*", s=320,
                   color="gold", edgecolors="black", zorder=5,
                   label="cheapest point meeting the SLO")
        ax.annotate(f"{describe(best, axes)}\n${best['usd_per_hour']:.2f}/h, TTFT p99 "
                    f"{_ms(best['ttft_p99_s'])}",
                    (best["usd_per_hour"], best["ttft_p99_s"]), textcoords="offset points",
                    xytext=(12, -28), fontsize=8.5,
                    bbox={"boxstyle": "round", "fc": "white", "ec": "0.6"})
    # Every point named by its number (the sweep's table and rows.csv); points that
    # coincide share one label.
    at: dict[tuple[float, float], list[str]] = {}
    for r in pts:
        at.setdefault((r["usd_per_hour"], r["ttft_p99_s"]), []).append(str(r.get("point")))
    for (x, y), names in at.items():
        ax.annotate(",".join(names), (x, y), textcoords="offset points", xytext=(5, 2),
                    fontsize=7, color="0.25")
    ys = [r["ttft_p99_s"] for r in pts if r["ttft_p99_s"] > 0]
    if ys and max(ys) / min(ys) > 30:
        ax.set_yscale("log")
    ax.set_xlabel("deployment cost (US$ per hour: GPUs × price per GPU-hour); "
                  "numbers: grid points (the sweep's table)")
    ax.set_ylabel("TTFT p99 (s)")
    ax.set_title(title or "cost vs TTFT p99 of every grid point", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.tight_layout()
    from pagedkv.sim.plots import save_figure

    return save_figure(fig, path)
