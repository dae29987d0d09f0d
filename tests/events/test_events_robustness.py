"""Bad options and endpoints reach the caller as pagedkv errors (never a raw ZMQError),
and a subscriber whose replay endpoint never answers still moves on: it gives up on the
gap after its retries and applies the batches that follow."""

from __future__ import annotations

import math
import time

import pytest

from pagedkv.core.records import BlockStored
from pagedkv.errors import ConfigError, InvalidArgumentError

zmq = pytest.importorskip("zmq")

BAD_SECONDS = [math.nan, math.inf, -math.inf, 0, -1, True, "1", b"1", [1], None, 1e300]


@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
def test_subscriber_refuses_a_bad_request_timeout(value):
    from pagedkv.events.subscriber import Subscriber

    with pytest.raises(InvalidArgumentError, match="request_timeout_s"):
        Subscriber(request_timeout_s=value)


@pytest.mark.parametrize(("option", "value"), [
    ("idle_probe_s", math.nan), ("idle_probe_s", -1), ("rcvhwm", 0), ("rcvhwm", 2**40),
    ("rcvhwm", True), ("rcvbuf_bytes", -5), ("rcvbuf_bytes", 1.5),
])
def test_subscriber_refuses_bad_socket_options(option, value):
    from pagedkv.events.subscriber import Subscriber

    with pytest.raises(InvalidArgumentError, match=option):
        Subscriber(**{option: value})


@pytest.mark.parametrize("endpoint", [
    "bogus://x", "tcp://", "tcp://127.0.0.1:notaport", "no-scheme", "", b"tcp://x:1", None,
])
@pytest.mark.parametrize("which", ["endpoint", "replay_endpoint"])
def test_add_publisher_with_a_bad_endpoint_adds_nothing(make_subscriber, endpoint, which):
    sub = make_subscriber()
    good = "tcp://127.0.0.1:1"
    args = {"endpoint": good, "replay_endpoint": good}
    args[which] = endpoint
    if which == "replay_endpoint" and endpoint is None:
        pytest.skip("no replay endpoint is allowed")
    with pytest.raises(InvalidArgumentError):
        sub.add_publisher("p", args["endpoint"], replay_endpoint=args["replay_endpoint"])
    with pytest.raises(KeyError):
        sub.status("p")
    sub.add_publisher("p", good)  # the id is still free
    assert sub.status("p").publisher_id == "p"


def test_publisher_on_an_endpoint_in_use_is_a_config_error(make_publisher):
    from pagedkv.events.config import KVEventsConfig
    from pagedkv.events.publisher import ZmqEventPublisher

    first = make_publisher(replay=False)
    with pytest.raises(ConfigError, match="in use"):
        ZmqEventPublisher(KVEventsConfig(endpoint=first.last_endpoint))
    with pytest.raises(ConfigError, match="endpoint 'bogus://x'"):
        ZmqEventPublisher(KVEventsConfig(endpoint="bogus://x"))  # refused by the config
    with pytest.raises(ConfigError, match="events endpoint"):
        ZmqEventPublisher(KVEventsConfig(endpoint="tcp://127.0.0.1:1",
                                         replay_endpoint=first.last_endpoint))


def _stored(h: int) -> BlockStored:
    return BlockStored(block_hashes=[h], parent_block_hash=None, token_ids=[1, 2],
                       block_size=2, lora_id=None, medium=None, lora_name=None,
                       extra_keys=None, group_idx=0)


def test_a_silent_replay_endpoint_does_not_stall_the_stream(make_subscriber):
    """A gap, a replay endpoint that never answers: after its retries the subscriber
    skips ahead (not synced) and applies every later batch."""
    from pagedkv.events.mirror import MirrorIndex
    from pagedkv.events.wire import encode_batch, encode_seq

    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    silent = ctx.socket(zmq.ROUTER)  # receives requests, answers none
    try:
        pub.bind("tcp://127.0.0.1:*")
        silent.bind("tcp://127.0.0.1:*")
        mirror = MirrorIndex()
        sub = make_subscriber(mirror=mirror, request_timeout_s=0.05, idle_probe_s=None)
        sub.add_publisher("p", pub.last_endpoint.decode(),
                          replay_endpoint=silent.last_endpoint.decode(), sync=False)

        def send(seq: int) -> None:
            pub.send_multipart([b"", encode_seq(seq),
                                encode_batch([_stored(100 + seq)], timestamp_s=0.0)])

        deadline = time.monotonic() + 30  # a hang guard, not a timing assertion
        while sub.status("p").num_batches == 0:  # the subscription is up
            assert time.monotonic() < deadline, "no batch ever arrived"
            send(0)
            sub.poll(0.01)
        seq = sub.status("p").next_seq
        send(seq + 5)  # a gap: the silent endpoint is asked to replay it
        while not sub.status("p").repairing:
            assert time.monotonic() < deadline, "the gap was not seen"
            sub.poll(0.01)
        applied_before = sub.status("p").num_batches
        later = seq + 6
        while sub.status("p").repairing or sub.status("p").next_seq <= seq + 6:
            assert time.monotonic() < deadline, "the subscriber stayed repairing"
            send(later)
            later += 1
            sub.poll(0.01)
        status = sub.status("p")
        assert not status.synced and not status.repairing
        assert status.num_batches > applied_before  # batches after the gap were applied
    finally:
        pub.close(linger=0)
        silent.close(linger=0)
