"""The HTTP side shared by pagedkv's Prometheus exporters: one registry of the
exporter's own (never the process-global one), exposed as text or served on 127.0.0.1.

Subclasses set ``self._prom`` (the ``prometheus_client`` module) and ``self.registry``
in their ``__init__`` and call :meth:`MetricsEndpoint.__init__` first::

    class MyExporter(MetricsEndpoint):
        def __init__(self) -> None:
            super().__init__(require("prometheus_client", "metrics", "my metrics"))
            ...  # register metrics on self.registry

    port = MyExporter().serve(0)   # http://127.0.0.1:<port>/metrics
"""

from __future__ import annotations

import sys
from typing import Any

from pagedkv.arg_types import check_port
from pagedkv.errors import InvalidArgumentError

__all__ = ["MetricsEndpoint", "serve_metrics"]


class MetricsEndpoint:
    """A Prometheus registry with a text dump and a loopback HTTP server."""

    def __init__(self, prom: Any) -> None:
        self._prom = prom
        self.registry: Any = prom.CollectorRegistry()
        self._server: Any = None
        self._thread: Any = None

    def text(self) -> str:
        """The current exposition (Prometheus text format)."""
        out: bytes = self._prom.generate_latest(self.registry)
        return out.decode()

    def serve(self, port: int = 0) -> int:
        """Serve ``/metrics`` on 127.0.0.1:``port`` (0: any free port) from a daemon
        thread; returns the bound port. Call :meth:`close` to stop.

        Raises:
            InvalidArgumentError: ``port`` is not a whole number in [0, 65535].
            OSError: the port is taken.
        """
        check_port("serve(port)", port, allow_zero=True)
        self._server, self._thread = self._prom.start_http_server(
            port, addr="127.0.0.1", registry=self.registry)
        bound: int = self._server.server_port
        return bound

    def close(self) -> None:
        """Stop the server (if serving). Idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None


def serve_metrics(endpoint: MetricsEndpoint, port: int) -> int:
    """``--metrics-port``: serve ``endpoint`` on 127.0.0.1:``port`` (0: a free one), say
    where on stderr and return the bound port.

    Raises:
        InvalidArgumentError: the port is taken (naming it and the fix).
    """
    try:
        bound = endpoint.serve(port)
    except OSError as exc:
        raise InvalidArgumentError(
            f"--metrics-port {port}: cannot listen on 127.0.0.1:{port} "
            f"({exc.strerror or exc}); choose another port or 0 for a free one") from None
    print(f"metrics: serving http://127.0.0.1:{bound}/metrics", file=sys.stderr, flush=True)
    return bound
