"""``pagedkv simulate --explain-misses`` and ``--metrics-port``: what the
command prints, plots and serves with them (:mod:`pagedkv.sim.observe_engine` does the
observing).

* ``--explain-misses``: the replay runs on an observed manager; the report gains a table
  of missed prompt tokens by reason, a one-line reading of it, and (with plots) a stacked
  bar plot of missed tokens by reason over simulated time,
  ``<plot dir>/missed_tokens_by_reason.png``; ``--json`` gains ``miss_breakdown``.
* ``--metrics-port N``: Prometheus metrics of the replay on ``http://127.0.0.1:N/metrics``
  (0: a free port, printed); ``--metrics-linger-s S`` keeps serving S seconds after the
  replay so a scraper gets the final values. Needs ``pip install 'pagedkv[metrics]'``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from pagedkv.errors import MissingDependencyError
from pagedkv.observe.metrics_endpoint import serve_metrics
from pagedkv.sim.observe_engine import MissBreakdown, ReplayObserver
from pagedkv.sim.observe_support import plot_missed_tokens
from pagedkv.sim.setup import ObserveOptions

__all__ = ["PLOT_NAME", "SimObserving", "linger", "serve_metrics"]

PLOT_NAME = "missed_tokens_by_reason.png"


def linger(seconds: float) -> None:
    """``--metrics-linger-s``: keep serving ``seconds`` after the replay (Ctrl-C stops)."""
    if not seconds:
        return
    print(f"metrics: replay done; serving for {seconds:g} s more", file=sys.stderr,
          flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop lingering
        time.sleep(seconds)


class SimObserving:
    """What ``--explain-misses`` / ``--metrics-port`` add to one ``pagedkv simulate`` run:
    build with :meth:`start` (None without the flags), pass :attr:`observer` to
    :func:`pagedkv.sim.run`, then :meth:`finish`."""

    def __init__(self, *, explain: bool, exporter: Any, linger_s: float,
                 ghost_entries: int = 1_000_000) -> None:
        self.explain = explain
        self.exporter = exporter
        self.linger_s = linger_s
        self.observer = ReplayObserver(exporter=exporter, ghost_entries=ghost_entries,
                                       residency_sample_every=100 if exporter else None)
        self._breakdown: MissBreakdown | None = None

    @classmethod
    def start(cls, options: ObserveOptions | None) -> SimObserving | None:
        """Start observing as ``options`` ask (None: not asked, returns None): the
        metrics server (its address on stderr) with ``metrics_port``.

        Raises:
            InvalidArgumentError: the port is taken.
            MissingDependencyError: ``metrics_port`` without ``prometheus_client``.
        """
        if options is None:
            return None
        port = options.metrics_port
        exporter = None
        if port is not None:
            from pagedkv.observe.prometheus import PrometheusExporter

            exporter = PrometheusExporter()
            serve_metrics(exporter, port)
        return cls(explain=options.explain_misses, exporter=exporter,
                   linger_s=options.metrics_linger_s, ghost_entries=options.ghost_entries)

    def breakdown(self) -> MissBreakdown:
        """The replay's miss breakdown (taken once, after the replay)."""
        if self._breakdown is None:
            self._breakdown = self.observer.breakdown()
        return self._breakdown

    def section(self) -> str:
        """The report section: the table and its one-line reading."""
        b = self.breakdown()
        return ("Missed prompt tokens by reason (the lookup each request was admitted "
                "with)\n" + b.table() + "\n" + b.interpretation() + "\n")

    def plot(self, plot_dir: str | Path, title: str) -> str:
        """Write the stacked bar plot into ``plot_dir``; a line saying where (or why not)."""
        try:
            path = plot_missed_tokens(
                self.breakdown().series, Path(plot_dir) / PLOT_NAME,
                title=f"{title}\nprompt tokens per interval of simulated time: missed by "
                "reason, and hit")
        except MissingDependencyError as exc:
            return f"missed-tokens plot skipped: {exc}"
        return f"missed tokens by reason over time: {path.resolve()}"

    def report(self, out: dict[str, Any], *, json_mode: bool) -> None:
        """With ``--explain-misses``: add ``miss_breakdown`` to the JSON report ``out``
        (``json_mode``, before it is written) or print the section."""
        if not self.explain:
            return
        if json_mode:
            out["miss_breakdown"] = self.breakdown().to_dict()
        else:
            print(self.section(), flush=True)

    def finish(self, *, plot_dir: str | None, json_mode: bool, title: str) -> None:
        """After the report: write the plot into ``plot_dir`` (None: no plots), record
        the last interval, linger (``--metrics-linger-s``) and stop serving."""
        try:
            if self.explain and plot_dir is not None:
                note = self.plot(plot_dir, title)
                print(note, file=sys.stderr if json_mode else sys.stdout, flush=True)
            self.breakdown()  # the last interval, for the exporter too
            if self.exporter is not None:
                linger(self.linger_s)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the metrics server (if any). Idempotent."""
        if self.exporter is not None:
            self.exporter.close()
