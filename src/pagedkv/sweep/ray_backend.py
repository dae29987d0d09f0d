"""The Ray backend (``pagedkv[ray]``): each point is a Ray task on a cluster you run.

The workload goes to the object store once (``ray.put``); every task receives its
reference, and each worker process fetches it on its first task and keeps it for the next
ones (one copy per worker, not per point). Outcomes come back as tasks finish
(``ray.wait``).

Connecting (:func:`connect`):

* a Ray session this process already started (``ray.init`` before the sweep) is used as
  it is;
* ``auto``: the cluster ``RAY_ADDRESS`` or ``ray start`` on this machine names, else a
  Ray started here for the sweep's duration, listening on 127.0.0.1 only;
* ``HOST:PORT`` or ``ray://HOST:PORT``: that cluster. The address is tried with a plain
  TCP connection first (:data:`CONNECT_TIMEOUT_S`), so an unreachable one fails in
  bounded time with one line instead of Ray's retries; then joined once in a child
  process bounded by :data:`JOIN_TIMEOUT_S` (a port that answers but is no Ray cluster
  can hold Ray's client for minutes), and only then from this process, Ray's own log
  lines kept off the terminal.

Workers run ``pagedkv`` from their own environment: install the same pagedkv version on
every node (the cache key holds the version of the machine that runs the sweep).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pagedkv.errors import MissingDependencyError, PagedKVError
from pagedkv.sim.workloads import Workload
from pagedkv.sweep.backends import Outcome, Task, compute

__all__ = ["CONNECT_TIMEOUT_S", "JOIN_TIMEOUT_S", "JOIN_TRIES", "RayBackend",
           "RayUnreachableError", "connect", "import_ray", "local_ray_env"]

#: Seconds to wait for a TCP connection to a cluster address before giving up.
CONNECT_TIMEOUT_S = 5.0
#: Seconds a trial connection to a cluster (in a child process) may take: something that
#: accepts connections but is no Ray cluster can hold Ray's client for minutes.
JOIN_TIMEOUT_S = 30.0
#: Tries (about a second each) Ray's client makes to reach a cluster's GCS.
JOIN_TRIES = 5
_PROBE = ("import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False, "
          "logging_level='ERROR'); ray.shutdown()")


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 pointed at /dev/null for the block (native libraries' logs)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class RayUnreachableError(PagedKVError):
    """The Ray cluster named cannot be reached."""


def local_ray_env() -> None:
    """Environment for a Ray started on this machine: no usage statistics, and every
    server on 127.0.0.1 (Ray otherwise resolves the node to its network address and
    binds its servers to every interface). Call before ``import ray``."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        MissingDependencyError: naming the extra.
    """
    local_ray_env()
    try:
        import ray
    except ModuleNotFoundError:
        raise MissingDependencyError("--ray needs Ray: pip install 'pagedkv[ray]'") from None
    return ray


def _host_port(address: str) -> tuple[str, int]:
    text = address.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RayUnreachableError(f"--ray {address!r}: give auto, HOST:PORT or "
                                  "ray://HOST:PORT")
    return host.strip("[]"), int(port)


def _check_reachable(address: str) -> None:
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise RayUnreachableError(
            f"cannot reach the Ray cluster at {address} ({why}): check the address, or "
            "start one with `ray start --head`") from None


def connect(address: str, *, num_cpus: int | None = None) -> bool:
    """Join Ray (module docstring); True when this call started it (the caller shuts
    it down), False when a session or cluster already existed.

    Raises:
        MissingDependencyError: Ray not installed.
        RayUnreachableError: the address cannot be reached.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    quiet = {"log_to_driver": False, "logging_level": "ERROR"}
    if address != "auto":
        _check_reachable(address)
        _probe(address)
        try:
            with _native_stderr_silenced():  # Ray's C++ client logs every failed try
                ray.init(address=address, **quiet)
        except Exception as exc:
            raise RayUnreachableError(f"cannot join the Ray cluster at {address}: "
                                      f"{' '.join(str(exc).split())}") from None
        return False
    if os.environ.get("RAY_ADDRESS"):
        return connect(os.environ["RAY_ADDRESS"])
    try:
        ray.init(address="auto", **quiet)
        return False
    except ConnectionError:
        pass  # no cluster on this machine: start one for this sweep
    ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             **quiet)
    return True


def _probe(address: str) -> None:
    """Join ``address`` once in a child process, bounded by :data:`JOIN_TIMEOUT_S`.

    Raises:
        RayUnreachableError: the child failed (its last error line) or timed out.
    """
    env = {**os.environ, "RAY_NUM_REDIS_GET_RETRIES": str(JOIN_TRIES)}
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, address], env=env,
                              capture_output=True, text=True, timeout=JOIN_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise RayUnreachableError(
            f"no Ray cluster answered at {address} within {JOIN_TIMEOUT_S:g} s: check the "
            "address (the GCS port of `ray start --head`, 6379 by default)") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if "Error" in ln
                 or "Failed" in ln] or ["the trial connection failed"]
        raise RayUnreachableError(f"cannot join the Ray cluster at {address}: "
                                  f"{lines[-1][:300]}")


# One workload per worker process, fetched on its first task: {object ref hex: workload}.
_WORKER_WORKLOAD: dict[str, Workload] = {}


def _ray_point(box: list[Any], index: int, options: Mapping[str, Any]) -> Outcome:
    """One task. ``box`` holds the workload's object reference (inside a list, so Ray
    hands the reference over instead of a fresh copy of the object per task)."""
    import ray

    ref = box[0]
    key = ref.hex()
    wl = _WORKER_WORKLOAD.get(key)
    if wl is None:
        _WORKER_WORKLOAD.clear()
        wl = ray.get(ref)
        _WORKER_WORKLOAD[key] = wl
    return compute(wl, index, options)


class RayBackend:
    """Points as Ray tasks (module docstring); ``address``: "auto" or a cluster's;
    ``num_cpus``: CPUs of a Ray started here (None: all)."""

    name = "ray"

    def __init__(self, address: str = "auto", *, num_cpus: int | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.workers = 1
        self._started = False
        self._open = False

    def open(self) -> None:
        """Connect (before the first point, so a bad address fails early)."""
        self._started = connect(self.address, num_cpus=self.num_cpus) or self._started
        ray = import_ray()
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._open = True

    def close(self) -> None:
        """Shut down a Ray this backend started."""
        if self._started:
            import_ray().shutdown()
            self._started = False
        self._open = False

    def run(self, workload: Workload, tasks: Sequence[Task]) -> Iterator[Outcome]:
        ray = import_ray()
        if not self._open or not ray.is_initialized():
            self.open()
        remote = ray.remote(num_cpus=1, max_retries=0)(_ray_point)
        box = [ray.put(workload)]
        started = time.perf_counter()
        pending = {remote.remote(box, index, dict(options)): index for index, options in tasks}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    index = pending.pop(ref)
                    try:
                        yield ray.get(ref)
                    except Exception as exc:  # the worker died, or the task could not run
                        text = " ".join(str(exc).split())[:300]
                        yield Outcome(index, None, f"Ray task failed: {text}",
                                      time.perf_counter() - started)
        finally:
            for ref in pending:
                ray.cancel(ref)
