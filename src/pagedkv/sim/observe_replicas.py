"""``pagedkv simulate --replicas N`` with ``--explain-misses`` and ``--metrics-port``:
every replica's engine observed as ``simulate`` observes its one
(:class:`~pagedkv.sim.observe_engine.ReplayObserver` each).

* ``--explain-misses``: per routing policy, the missed prompt tokens by reason summed
  over the replicas (the table and its one-line reading after the comparison table;
  ``--json``: ``miss_breakdown`` and ``miss_breakdown_per_replica`` on each result), and
  the stacked bar plot (``missed_tokens_by_reason.png``; with ``--router compare`` one
  per policy, ``missed_tokens_by_reason_<policy>.png``).
* ``--metrics-port N``: one Prometheus endpoint on 127.0.0.1 for every replica, each
  replica's metrics (those of :mod:`pagedkv.observe.prometheus`) labelled
  ``replica="<k>"`` and ``router="<policy>"``.

One replica behind round-robin gives what ``simulate`` gives: the same breakdown, and the
same metric values (with the two labels).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pagedkv.errors import MissingDependencyError, require
from pagedkv.observe.metrics_endpoint import MetricsEndpoint
from pagedkv.sim.observe_cli import PLOT_NAME, linger, serve_metrics
from pagedkv.sim.observe_engine import MissBreakdown, ReplayObserver, merged_breakdown
from pagedkv.sim.observe_support import plot_missed_tokens
from pagedkv.sim.setup import ObserveOptions

__all__ = ["ReplicaMetrics", "ReplicaObserving"]


class _Labelled:
    """A collector: every sample of each part's registry with the part's labels added."""

    def __init__(self, parts: list[tuple[dict[str, str], Any]], prom: Any) -> None:
        self.parts = parts
        self.metric = prom.metrics_core.Metric

    def collect(self) -> list[Any]:
        families: dict[str, Any] = {}
        for labels, exporter in list(self.parts):  # the server thread reads; copy
            for fam in exporter.registry.collect():
                out = families.get(fam.name)
                if out is None:
                    out = families[fam.name] = self.metric(fam.name, fam.documentation,
                                                           fam.type, fam.unit)
                for s in fam.samples:
                    out.add_sample(s.name, {**s.labels, **labels}, s.value, s.timestamp,
                                   s.exemplar)
        return list(families.values())


class ReplicaMetrics(MetricsEndpoint):
    """One Prometheus endpoint for several replicas: :meth:`exporter` gives each its own
    :class:`~pagedkv.observe.prometheus.PrometheusExporter`; the endpoint serves all of
    their samples, each labelled as its exporter was asked.

    Raises:
        MissingDependencyError: ``prometheus_client`` is not installed.
    """

    def __init__(self) -> None:
        prom: Any = require("prometheus_client", "metrics", "the Prometheus exporter")
        import prometheus_client.metrics_core  # noqa: F401  (the Metric class)

        super().__init__(prom)
        self._parts: list[tuple[dict[str, str], Any]] = []
        self.registry.register(_Labelled(self._parts, prom))

    def exporter(self, **labels: str) -> Any:
        """A new exporter whose samples the endpoint serves with ``labels`` added."""
        from pagedkv.observe.prometheus import PrometheusExporter

        exp = PrometheusExporter()
        self._parts.append((dict(labels), exp))
        return exp


class ReplicaObserving:
    """What ``--explain-misses`` / ``--metrics-port`` add to a ``--replicas`` run: build
    with :meth:`start` (None without the flags), pass :meth:`observers` of each policy to
    :func:`~pagedkv.sim.replicas.run_replicas`, then report and :meth:`finish`."""

    def __init__(self, options: ObserveOptions, metrics: ReplicaMetrics | None,
                 port: int | None = None) -> None:
        self.options = options
        self.metrics = metrics
        #: The metrics server's port (None: not serving).
        self.port = port
        self._observers: dict[str, list[ReplayObserver]] = {}

    @classmethod
    def start(cls, options: ObserveOptions | None) -> ReplicaObserving | None:
        """Start observing as ``options`` ask (None: not asked, returns None): the one
        metrics server (its address on stderr) with ``metrics_port``.

        Raises:
            InvalidArgumentError: the port is taken.
            MissingDependencyError: ``metrics_port`` without ``prometheus_client``.
        """
        if options is None:
            return None
        metrics = port = None
        if options.metrics_port is not None:
            metrics = ReplicaMetrics()
            port = serve_metrics(metrics, options.metrics_port)
        return cls(options, metrics, port)

    def observers(self, policy: str, num_replicas: int) -> list[ReplayObserver]:
        """One observer per replica of ``policy``'s run (each exporting with its labels)."""
        out = []
        for k in range(num_replicas):
            exporter = None if self.metrics is None else self.metrics.exporter(
                replica=str(k), router=policy)
            out.append(ReplayObserver(exporter=exporter,
                                      ghost_entries=self.options.ghost_entries,
                                      residency_sample_every=100 if exporter else None))
        self._observers[policy] = out
        return out

    def breakdown(self, policy: str) -> MissBreakdown:
        """The missed tokens by reason of ``policy``'s run, summed over its replicas."""
        return merged_breakdown(self._observers[policy])

    def add_json(self, result: dict[str, Any]) -> None:
        """With ``--explain-misses``: ``miss_breakdown`` (summed) and
        ``miss_breakdown_per_replica`` on the JSON ``result`` of one policy."""
        if not self.options.explain_misses:
            return
        policy = result["policy"]
        result["miss_breakdown"] = self.breakdown(policy).to_dict()
        result["miss_breakdown_per_replica"] = [
            merged_breakdown([o]).to_dict() for o in self._observers[policy]]

    def sections(self) -> str:
        """With ``--explain-misses``: per policy, the table and its one-line reading."""
        if not self.options.explain_misses:
            return ""
        parts = []
        for policy, observers in self._observers.items():
            b = self.breakdown(policy)
            n = len(observers)
            parts.append(f"Missed prompt tokens by reason ({policy}, summed over {n} "
                         f"{'replica' if n == 1 else 'replicas'}; the lookup each request "
                         f"was admitted with)\n{b.table()}\n{b.interpretation()}\n")
        return "\n".join(parts)

    def finish(self, *, plot_dir: str | None, json_mode: bool, title: str) -> None:
        """After the report: the plots into ``plot_dir`` (None: none), linger
        (``--metrics-linger-s``) and stop serving."""
        try:
            if self.options.explain_misses and plot_dir is not None:
                for policy in self._observers:
                    note = self._plot(policy, Path(plot_dir), title)
                    print(note, file=sys.stderr if json_mode else sys.stdout, flush=True)
            for policy in self._observers:
                self.breakdown(policy)  # the last interval, for the exporters too
            if self.metrics is not None:
                linger(self.options.metrics_linger_s)
        finally:
            self.close()

    def _plot(self, policy: str, plot_dir: Path, title: str) -> str:
        name = PLOT_NAME if len(self._observers) == 1 else \
            PLOT_NAME.replace(".png", f"_{policy}.png")
        try:
            path = plot_missed_tokens(
                self.breakdown(policy).series, plot_dir / name,
                title=f"{title}\n{policy}: prompt tokens per interval of simulated time "
                "over every replica: missed by reason, and hit")
        except MissingDependencyError as exc:
            return f"missed-tokens plot skipped: {exc}"
        return f"missed tokens by reason over time ({policy}): {path.resolve()}"

    def close(self) -> None:
        """Stop the metrics server (if any). Idempotent."""
        if self.metrics is not None:
            self.metrics.close()
