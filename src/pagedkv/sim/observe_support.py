"""Miss breakdowns for a workload replay: a table of missed tokens by reason and a stacked
bar plot of missed tokens by reason over time.

Inputs are per-interval :class:`~pagedkv.observe.reasons.MissStats` (what
``ObservedKVCacheManager.make_miss_stats`` returns, one per sampling interval) with the
interval's end time, or timed explanations folded into such intervals by
:func:`intervals_from_explanations`.

>>> from pagedkv.observe.reasons import MissStats
>>> s = MissStats(requests=2, queries=100, hits=40, missed_tokens={"evicted": 45,
...     "never_seen": 15}, preempted_requests=0, preempted_queries=0, preempted_hits=0,
...     preempted_missed_tokens={})
>>> print(render_miss_table(miss_table([s])))
reason        missed tokens  % of misses  % of queried
evicted                  45       75.0 %        45.0 %
never_seen               15       25.0 %        15.0 %
total missed             60      100.0 %        60.0 %
hit                      40                     40.0 %
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pagedkv.errors import InvalidArgumentError, require
from pagedkv.observe.reasons import LookupExplanation, MissStats, Reason

__all__ = [
    "MissRow",
    "intervals_from_explanations",
    "merge_miss_stats",
    "miss_table",
    "plot_missed_tokens",
    "render_miss_table",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class MissRow:
    """One line of the miss table: a reason label and its missed tokens."""

    label: str
    tokens: int
    share_of_misses: float | None
    share_of_queried: float


def merge_miss_stats(stats: Iterable[MissStats]) -> MissStats:
    """The sum of several intervals. O(intervals x labels)."""
    req = q = h = pr = pq = ph = 0
    missed: dict[str, int] = {}
    pmissed: dict[str, int] = {}
    for s in stats:
        req += s.requests
        q += s.queries
        h += s.hits
        pr += s.preempted_requests
        pq += s.preempted_queries
        ph += s.preempted_hits
        for k, v in s.missed_tokens.items():
            missed[k] = missed.get(k, 0) + v
        for k, v in s.preempted_missed_tokens.items():
            pmissed[k] = pmissed.get(k, 0) + v
    return MissStats(requests=req, queries=q, hits=h, missed_tokens=missed,
                     preempted_requests=pr, preempted_queries=pq, preempted_hits=ph,
                     preempted_missed_tokens=pmissed)


def miss_table(stats: Iterable[MissStats]) -> list[MissRow]:
    """Rows by missed tokens (largest first), then ``total missed`` and ``hit``; fresh
    lookups only (preempted re-lookups are not traffic)."""
    total = merge_miss_stats(stats)
    missed = sum(total.missed_tokens.values())
    q = total.queries or 1
    rows = [MissRow(label=k, tokens=v, share_of_misses=v / missed if missed else None,
                    share_of_queried=v / q)
            for k, v in sorted(total.missed_tokens.items(), key=lambda kv: (-kv[1], kv[0]))]
    rows.append(MissRow(label="total missed", tokens=missed,
                        share_of_misses=1.0 if missed else None, share_of_queried=missed / q))
    rows.append(MissRow(label="hit", tokens=total.hits, share_of_misses=None,
                        share_of_queried=total.hits / q))
    return rows


def render_miss_table(rows: Sequence[MissRow]) -> str:
    """The rows as a plain-text table."""
    width = max([len("reason"), *(len(r.label) for r in rows)]) + 2
    lines = [f"{'reason':<{width}}{'missed tokens':>13}{'% of misses':>13}{'% of queried':>14}"]
    for r in rows:
        share = f"{100 * r.share_of_misses:.1f} %" if r.share_of_misses is not None else ""
        lines.append(f"{r.label:<{width}}{r.tokens:>13,}{share:>13}"
                     f"{100 * r.share_of_queried:>12.1f} %")
    return "\n".join(lines)


def intervals_from_explanations(
    timed: Iterable[tuple[float, LookupExplanation]], interval_s: float
) -> list[tuple[float, MissStats]]:
    """Fold ``(lookup time, explanation)`` pairs (fresh lookups) into intervals of
    ``interval_s`` seconds, each labelled by its end time; empty intervals included.

    Raises:
        InvalidArgumentError: ``interval_s <= 0``.
    """
    if interval_s <= 0:
        raise InvalidArgumentError(f"interval_s must be > 0, got {interval_s!r}")
    buckets: dict[int, list[LookupExplanation]] = {}
    for t, e in timed:
        buckets.setdefault(int(t // interval_s), []).append(e)
    if not buckets:
        return []
    out = []
    for k in range(max(buckets) + 1):
        missed: dict[str, int] = {}
        q = h = 0
        es = buckets.get(k, [])
        for e in es:
            q += e.num_tokens
            h += e.num_hit_tokens
            for s in e.segments:
                if s.reason is not Reason.HIT:
                    missed[s.label] = missed.get(s.label, 0) + s.end - s.start
        out.append(((k + 1) * interval_s, MissStats(
            requests=len(es), queries=q, hits=h, missed_tokens=missed, preempted_requests=0,
            preempted_queries=0, preempted_hits=0, preempted_missed_tokens={})))
    return out


def plot_missed_tokens(
    series: Sequence[tuple[float, MissStats]], path: str | Path, *, title: str = ""
) -> Path:
    """A stacked bar per interval: missed tokens by reason (and the hit tokens, hatched
    grey, on top) against the interval's end time. Writes a PNG and returns its path.

    Raises:
        MissingDependencyError: matplotlib is not installed (``pip install
            'pagedkv[plot]'``).
        InvalidArgumentError: ``series`` is empty.
    """
    if not series:
        raise InvalidArgumentError("no intervals to plot; replay a workload first")
    require("matplotlib", "plot", "the missed-tokens plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pagedkv.sim.plots import human_label, save_figure

    totals = merge_miss_stats(s for _, s in series).missed_tokens
    labels = sorted(totals, key=lambda k: -totals[k])
    times = [t for t, _ in series]
    width = (times[1] - times[0]) * 0.9 if len(times) > 1 else 1.0
    fig, ax = plt.subplots(figsize=(11, 4.5))
    bottom = [0.0] * len(series)
    colors = plt.get_cmap("tab10")
    for n, label in enumerate(labels):
        values = [s.missed_tokens.get(label, 0) / 1e3 for _, s in series]
        # A negative width with edge alignment: each bar spans its interval, ending at t.
        ax.bar(times, values, -width, bottom=bottom, label=human_label(label),
               color=colors(n % 10),
               align="edge")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    hits = [s.hits / 1e3 for _, s in series]
    ax.bar(times, hits, -width, bottom=bottom, label="hit", color="lightgrey", hatch="//",
           align="edge")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("prompt tokens (thousands)")
    ax.set_title(title or "Prompt tokens per interval: missed by reason, and hit")
    # Outside the axes, to the right: the bars keep the whole height; legend entries
    # top-down in the order of the stack bottom-up reversed (the hit on top).
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize=8, title="prompt tokens", title_fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
