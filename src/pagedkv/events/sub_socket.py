"""The subscriber's socket set-up, checked: options refused by name, endpoints ZeroMQ
cannot connect to refused as :class:`~pagedkv.errors.InvalidArgumentError` (never a raw
``zmq.ZMQError``), nothing left open on failure."""

from __future__ import annotations

from typing import Any, NamedTuple

from pagedkv.checks import check_number, check_text, check_whole
from pagedkv.cli_args import MAX_SECONDS
from pagedkv.errors import InvalidArgumentError

__all__ = ["MAX_SOCKET_SIZE", "SubOptions", "check_options", "connect_sub"]

#: ZeroMQ socket options are C ints.
MAX_SOCKET_SIZE = 2**31 - 1


def check_options(request_timeout_s: object, idle_probe_s: object, rcvhwm: object,
                  rcvbuf_bytes: object) -> None:
    """The :class:`~pagedkv.events.transport.Subscriber` options: timeouts finite seconds
    in (0, 10^9] (``idle_probe_s`` may be None), sizes whole numbers in [1, 2**31 - 1]
    (``rcvbuf_bytes`` may be None). Raises InvalidArgumentError naming the option."""
    check_number("request_timeout_s", request_timeout_s, minimum=0, minimum_exclusive=True,
                 maximum=MAX_SECONDS)
    if idle_probe_s is not None:
        check_number("idle_probe_s", idle_probe_s, minimum=0, minimum_exclusive=True,
                     maximum=MAX_SECONDS, hint=" (None: never probe)")
    check_whole("rcvhwm", rcvhwm, minimum=1, maximum=MAX_SOCKET_SIZE)
    if rcvbuf_bytes is not None:
        check_whole("rcvbuf_bytes", rcvbuf_bytes, minimum=1, maximum=MAX_SOCKET_SIZE)


class SubOptions(NamedTuple):
    """What one publisher's SUB socket connects to and how."""

    endpoint: object
    replay_endpoint: object
    topic: str
    rcvhwm: int
    rcvbuf_bytes: int | None


def connect_sub(zmq: Any, context: Any, options: SubOptions) -> Any:
    """A SUB socket connected to ``options.endpoint``, returned once the replay endpoint
    (if any) connects too (a throw-away DEALER tries it).

    Raises:
        InvalidArgumentError: an endpoint that is not a non-empty string, or one ZeroMQ
            cannot connect to (malformed, unknown transport); no socket is left open.
    """
    check_text("endpoint", options.endpoint, allow_empty=False)
    if options.replay_endpoint is not None:
        check_text("replay_endpoint", options.replay_endpoint, allow_empty=False)
    sub = context.socket(zmq.SUB)
    current = options.endpoint
    try:
        sub.setsockopt(zmq.RCVHWM, options.rcvhwm)
        if options.rcvbuf_bytes is not None:
            sub.setsockopt(zmq.RCVBUF, options.rcvbuf_bytes)
        sub.setsockopt(zmq.SUBSCRIBE, options.topic.encode())
        sub.connect(options.endpoint)
        if options.replay_endpoint is not None:
            current = options.replay_endpoint
            probe = context.socket(zmq.DEALER)
            try:
                probe.connect(options.replay_endpoint)
            finally:
                probe.close(linger=0)
    except zmq.ZMQError as exc:
        sub.close(linger=0)
        raise InvalidArgumentError(
            f"cannot connect to {current!r}: {exc}; give an endpoint such as "
            "'tcp://127.0.0.1:5557'") from exc
    return sub
