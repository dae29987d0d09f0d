"""The fields of the KV-cache event publisher's configuration and their checks
(dependency-free; :class:`pagedkv.events.config.KVEventsConfig` adds the publisher it builds).

The façade builds a :class:`ZmqEventPublisher` from one of these when events are enabled;
nothing here imports ZeroMQ or msgpack.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv.core.records import WireForm
from pagedkv.errors import ConfigError

__all__ = ["DEFAULT_ENDPOINT", "KVEventsSettings", "WireForm", "kv_topic", "should_bind"]


DEFAULT_ENDPOINT = "tcp://*:5557"


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
    """
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


@dataclass(frozen=True, kw_only=True, slots=True)
class KVEventsSettings:
    """Where and how KV-cache events are published.

    Attributes:
        endpoint: ZeroMQ PUB endpoint (bound or connected per :func:`should_bind`).
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

    Raises:
        ConfigError: a size below 1, an unknown wire form, an empty endpoint.
    """

    endpoint: str = DEFAULT_ENDPOINT
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000
    max_queue_size: int = 100_000
    wire_form: WireForm = "map"
    data_parallel_rank: int | None = 0
    hwm: int = 100_000

    def __post_init__(self) -> None:
        if not self.endpoint:
            raise ConfigError("KVEventsConfig.endpoint is empty; give e.g. 'tcp://*:5557'")
        if self.replay_endpoint == self.endpoint and not self.endpoint.endswith(":*"):
            raise ConfigError(
                f"KVEventsConfig.replay_endpoint equals endpoint ({self.endpoint!r}); "
                "the replay socket needs its own address"
            )
        for name in ("buffer_steps", "max_queue_size", "hwm"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"KVEventsConfig.{name} must be an int >= 1, got {value!r}")
        if self.wire_form not in ("map", "array"):
            raise ConfigError(
                f"KVEventsConfig.wire_form must be 'map' or 'array', got {self.wire_form!r}"
            )
        rank = self.data_parallel_rank
        if rank is not None and (not isinstance(rank, int) or rank < 0):
            raise ConfigError(
                f"KVEventsConfig.data_parallel_rank must be None or an int >= 0, got {rank!r}"
            )
