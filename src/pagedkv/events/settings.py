"""The fields of the KV-cache event publisher's configuration and their checks
(dependency-free; :class:`pagedkv.events.config.KVEventsConfig` adds the publisher it builds).

The façade builds a :class:`ZmqEventPublisher` from one of these when events are enabled;
nothing here imports ZeroMQ or msgpack.

Exposure: event messages carry prompt token ids (``BlockStored.token_ids``) and the
sockets have no authentication or encryption. The default endpoint therefore binds the
loopback interface only, and a bound endpoint reachable beyond this host (``tcp://*:...``,
``tcp://0.0.0.0:...``, ``tcp://[::]:...``, a non-loopback address) is refused unless
``allow_remote=True`` says so deliberately.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from pagedkv.arg_types import check_endpoint
from pagedkv.checks import check_flag, check_text, check_whole
from pagedkv.core.records import WireForm
from pagedkv.errors import ConfigError

__all__ = ["DEFAULT_ENDPOINT", "KVEventsSettings", "WireForm", "binds_beyond_loopback",
           "kv_topic", "should_bind"]

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"
"""Loopback only: subscribers on other hosts need ``allow_remote=True`` and a wildcard or
interface address (vLLM's default is ``tcp://*:5557``, every interface)."""

#: Largest ZeroMQ high-water mark (a C int).
_MAX_HWM = 2**31 - 1 - 16


def _tcp_host(endpoint: str) -> str | None:
    """The host part of a ``tcp://HOST:PORT`` endpoint, brackets removed; else None."""
    if not endpoint.startswith("tcp://"):
        return None
    host = endpoint[len("tcp://"):].rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_wildcard_address(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified  # 0.0.0.0, ::
    except ValueError:
        return False


def kv_topic(pod_id: str, model_name: str) -> str:
    """The ``kv@<pod-id>@<model-name>`` topic that KV-aware routers (llm-d) expect.

    >>> kv_topic("10.0.0.7", "Qwen/Qwen3-0.6B")
    'kv@10.0.0.7@Qwen/Qwen3-0.6B'
    """
    return f"kv@{pod_id}@{model_name}"


def should_bind(endpoint: str) -> bool:
    """Whether a publisher binds ``endpoint`` (True) or connects to it (False).

    Binds when the address is a wildcard (``*`` or ``::``) or the transport is local
    (``ipc://``, ``inproc://``); connects otherwise (e.g. to a forwarder).

    >>> should_bind("tcp://*:5557"), should_bind("tcp://10.0.0.1:5557")
    (True, False)

    Also binds a loopback address (``tcp://127.0.0.1:5557``, ``tcp://[::1]:5557``) and
    the unspecified address ``0.0.0.0``, where vLLM would connect: so the default
    endpoint listens on this host only, and ``0.0.0.0`` means every interface.

    >>> should_bind("tcp://127.0.0.1:5557")
    True
    """
    host = _tcp_host(endpoint)
    return ("*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
            or (host is not None and (_is_loopback(host) or _is_wildcard_address(host))))


def binds_beyond_loopback(endpoint: str) -> bool:
    """Whether a publisher bound at ``endpoint`` can be reached from other hosts: a bound
    ``tcp://`` endpoint whose address is a wildcard or not a loopback address.

    >>> binds_beyond_loopback("tcp://*:5557"), binds_beyond_loopback("tcp://127.0.0.1:*")
    (True, False)
    >>> binds_beyond_loopback("tcp://10.0.0.1:5557")  # connects: a forwarder's address
    False
    """
    host = _tcp_host(endpoint)
    return host is not None and should_bind(endpoint) and not _is_loopback(host)


@dataclass(frozen=True, kw_only=True, slots=True)
class KVEventsSettings:
    """Where and how KV-cache events are published.

    Attributes:
        endpoint: ZeroMQ PUB endpoint (bound or connected per :func:`should_bind`);
            default ``tcp://127.0.0.1:5557`` (loopback only).
        replay_endpoint: ROUTER endpoint that serves replay and snapshot requests;
            ``None`` disables both (subscribers then cannot repair gaps).
        topic: first frame of every message; see :func:`kv_topic` for the router
            convention. Subscribers filter on its prefix.
        buffer_steps: how many recent batches the replay socket can re-send.
        max_queue_size: batches waiting for the background sender; beyond it
            :meth:`ZmqEventPublisher.publish` drops the batch (and counts it) rather
            than block the engine.
        wire_form: ``"map"`` (current vLLM) or ``"array"`` (vLLM <= 0.23).
        data_parallel_rank: last element of every payload (``None`` encodes as nil).
        hwm: ZeroMQ send high-water mark in messages, per subscriber; a subscriber
            that falls this far behind loses messages (and repairs them by replay).
        allow_remote: permit an endpoint or replay endpoint that binds beyond loopback
            (:func:`binds_beyond_loopback`). The messages carry prompt token ids and the
            sockets have no authentication: set it only on a trusted network.

    Raises:
        ConfigError: a size below 1 (or above 2**31 - 17), an unknown wire form, an
            empty endpoint, a field of the wrong type, a bind beyond loopback without
            ``allow_remote=True``.
    """

    endpoint: str = DEFAULT_ENDPOINT
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000
    max_queue_size: int = 100_000
    wire_form: WireForm = "map"
    data_parallel_rank: int | None = 0
    hwm: int = 100_000
    allow_remote: bool = False

    def __post_init__(self) -> None:
        check_endpoint("KVEventsConfig.endpoint", self.endpoint, error=ConfigError)
        if self.replay_endpoint is not None:
            check_endpoint("KVEventsConfig.replay_endpoint", self.replay_endpoint,
                           error=ConfigError)
        check_text("KVEventsConfig.topic", self.topic, error=ConfigError)
        check_flag("KVEventsConfig.allow_remote", self.allow_remote, error=ConfigError)
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and binds_beyond_loopback(value) and not self.allow_remote:
                raise ConfigError(
                    f"KVEventsConfig.{name} {value!r} listens beyond this host, and event "
                    "messages carry prompt token ids without authentication; bind "
                    "loopback (tcp://127.0.0.1:PORT) or pass allow_remote=True on a "
                    "trusted network")
        if self.replay_endpoint == self.endpoint and not self.endpoint.endswith(":*"):
            raise ConfigError(
                f"KVEventsConfig.replay_endpoint equals endpoint ({self.endpoint!r}); "
                "the replay socket needs its own address"
            )
        for name in ("buffer_steps", "max_queue_size", "hwm"):
            check_whole(f"KVEventsConfig.{name}", getattr(self, name), minimum=1,
                        maximum=_MAX_HWM, error=ConfigError)
        if self.wire_form not in ("map", "array"):
            raise ConfigError(
                f"KVEventsConfig.wire_form must be 'map' or 'array', got {self.wire_form!r}"
            )
        rank = self.data_parallel_rank
        if rank is not None:
            check_whole("KVEventsConfig.data_parallel_rank", rank, minimum=0,
                        maximum=2**32 - 1, error=ConfigError)
