"""``pagedkv simulate --explain-misses`` and ``--metrics-port``: the flags, and what the
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

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from pagedkv.cli_args import seconds_arg
from pagedkv.errors import InvalidArgumentError, MissingDependencyError
from pagedkv.sim.observe_engine import MissBreakdown, ReplayObserver
from pagedkv.sim.observe_support import plot_missed_tokens

__all__ = ["PLOT_NAME", "SimObserving", "add_observe_flags"]

PLOT_NAME = "missed_tokens_by_reason.png"


def add_observe_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--explain-misses`` / ``--metrics-*`` flags to ``pagedkv simulate``."""
    g = parser.add_argument_group("why the cache missed, and Prometheus metrics (engine mode)")
    g.add_argument("--explain-misses", action="store_true",
                   help="attribute every missed prompt token to a reason (never seen, "
                   "evicted, isolated by a salt, partial block, hybrid clamps...): a table, "
                   "a one-line reading and a plot of missed tokens by reason over time")
    g.add_argument("--ghost-entries", type=int, default=1_000_000, metavar="N",
                   help="with --explain-misses: evictions remembered to tell 'evicted' from "
                   "'never seen' (default 1,000,000, about 270 MB)")
    g.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics of the replay on 127.0.0.1:PORT (0: a free "
                   "port, printed); needs pagedkv[metrics]")
    g.add_argument("--metrics-linger-s", type=seconds_arg("--metrics-linger-s", allow_zero=True),
                   default=0.0, metavar="S",
                   help="with --metrics-port: keep serving S seconds after the replay "
                   "(default 0)")


class SimObserving:
    """What ``--explain-misses`` / ``--metrics-port`` add to one ``pagedkv simulate`` run:
    build with :meth:`from_args` (None without the flags), pass :attr:`observer` to
    :func:`pagedkv.sim.run`, then :meth:`finish`."""

    def __init__(self, *, explain: bool, exporter: Any, linger_s: float,
                 ghost_entries: int = 1_000_000) -> None:
        self.explain = explain
        self.exporter = exporter
        self.linger_s = linger_s
        self.observer = ReplayObserver(exporter=exporter, ghost_entries=ghost_entries,
                                       residency_sample_every=100 if exporter else None)
        self._breakdown: MissBreakdown | None = None

    @staticmethod
    def check_args(args: argparse.Namespace) -> bool:
        """Check the flags (before anything runs); whether any is given.

        Raises:
            InvalidArgumentError: not engine mode, with ``--replicas``, a bad port, ghost
                size or linger time.
        """
        port = args.metrics_port
        if not args.explain_misses and port is None:
            if args.metrics_linger_s:
                raise InvalidArgumentError("--metrics-linger-s goes with --metrics-port")
            return False
        flag = "--explain-misses" if args.explain_misses else "--metrics-port"
        if args.mode != "engine":
            raise InvalidArgumentError(f"{flag} observes the simulated engine: use it with "
                                       "--mode engine")
        if getattr(args, "replicas", None) is not None:
            raise InvalidArgumentError(f"{flag} observes one engine: leave out --replicas")
        if args.ghost_entries < 0:
            raise InvalidArgumentError(f"--ghost-entries must be >= 0, got {args.ghost_entries}")
        if args.metrics_linger_s < 0:
            raise InvalidArgumentError(
                f"--metrics-linger-s must be >= 0, got {args.metrics_linger_s}")
        if port is not None and not 0 <= port <= 65535:
            raise InvalidArgumentError(f"--metrics-port must be in [0, 65535], got {port}")
        return True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SimObserving | None:
        """Check the flags (:meth:`check_args`) and start the metrics server (its address
        on stderr); None without the flags.

        Raises:
            InvalidArgumentError: as :meth:`check_args`, or the port is taken.
            MissingDependencyError: ``--metrics-port`` without ``prometheus_client``.
        """
        if not cls.check_args(args):
            return None
        port = args.metrics_port
        exporter = None
        if port is not None:
            from pagedkv.observe.prometheus import PrometheusExporter

            exporter = PrometheusExporter()
            try:
                bound = exporter.serve(port)
            except OSError as exc:
                raise InvalidArgumentError(
                    f"--metrics-port {port}: cannot listen on 127.0.0.1:{port} "
                    f"({exc.strerror or exc}); choose another port or 0 for a free one"
                ) from None
            print(f"metrics: serving http://127.0.0.1:{bound}/metrics", file=sys.stderr,
                  flush=True)
        return cls(explain=args.explain_misses, exporter=exporter,
                   linger_s=args.metrics_linger_s, ghost_entries=args.ghost_entries)

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
            if self.exporter is not None and self.linger_s:
                print(f"metrics: replay done; serving for {self.linger_s:g} s more",
                      file=sys.stderr, flush=True)
                with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop lingering
                    time.sleep(self.linger_s)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the metrics server (if any). Idempotent."""
        if self.exporter is not None:
            self.exporter.close()
