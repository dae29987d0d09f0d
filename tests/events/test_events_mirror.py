"""MirrorIndex, snapshot compaction and KVEventsConfig, without sockets."""

from __future__ import annotations

import random

import pytest
from events_fakes import FakeEngine

from pagedkv.errors import ConfigError, InvalidArgumentError
from pagedkv.events import MEDIUM_CPU, MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored
from pagedkv.events.config import KVEventsConfig, kv_topic, should_bind
from pagedkv.events.snapshot import compact_stored, snapshot_events, stored_from_snapshot_events
from pagedkv.events.subscriber import MirrorIndex, index_counts


def h(n: int) -> bytes:
    """A 32-byte digest whose wire hash is ``n``."""
    return bytes(24) + n.to_bytes(8, "big")


def stored(hashes, parent=None, *, group=0, medium=MEDIUM_GPU, block_size=2):
    return BlockStored(
        [h(x) for x in hashes],
        None if parent is None else h(parent),
        list(range(len(hashes) * block_size)),
        block_size,
        None,
        medium,
        None,
        None,
        group,
    )


def removed(hashes, *, group=0, medium=MEDIUM_GPU):
    return BlockRemoved([h(x) for x in hashes], medium, group)


def test_longest_prefix_per_publisher():
    mirror = MirrorIndex()
    mirror.apply("a", [stored([1, 2, 3])])
    mirror.apply("b", [stored([1, 4])])
    mirror.add_publisher("c")
    mirror.check_invariants()
    assert mirror.longest_prefix([1, 2, 3, 5]) == {"a": 3, "b": 1, "c": 0}
    assert mirror.longest_prefix([1, 4]) == {"a": 1, "b": 2, "c": 0}
    assert mirror.longest_prefix([9, 1]) == {"a": 0, "b": 0, "c": 0}
    assert mirror.longest_prefix([]) == {"a": 0, "b": 0, "c": 0}
    # A hole stops the count even if later blocks are cached.
    mirror.apply("a", [removed([2])])
    assert mirror.longest_prefix([1, 2, 3]) == {"a": 1, "b": 1, "c": 0}
    assert mirror.publisher_ids == ["a", "b", "c"]


def test_duplicates_need_as_many_removals():
    mirror = MirrorIndex()
    mirror.apply("a", [stored([1]), stored([1])])
    assert mirror.blocks("a") == {(1, 0, MEDIUM_GPU): 2}
    mirror.apply("a", [removed([1])])
    assert mirror.longest_prefix([1]) == {"a": 1}
    mirror.apply("a", [removed([1])])
    assert mirror.longest_prefix([1]) == {"a": 0}
    mirror.apply("a", [removed([1])])  # one too many: ignored, counted
    assert mirror.num_unmatched_removals == 1
    assert mirror.num_blocks("a") == 0
    mirror.check_invariants()


def test_groups_and_media_are_kept_apart():
    mirror = MirrorIndex()
    mirror.apply("a", [stored([1, 2], group=1), stored([1], medium=MEDIUM_CPU)])
    assert mirror.longest_prefix([1, 2]) == {"a": 1}
    assert mirror.longest_prefix([1, 2], group_idx=1) == {"a": 2}
    assert mirror.longest_prefix([1], medium=MEDIUM_GPU) == {"a": 0}
    assert mirror.longest_prefix([1], medium=MEDIUM_CPU) == {"a": 1}
    mirror.apply("a", [removed([1], medium=MEDIUM_GPU)])  # not on GPU in group 0
    assert mirror.num_unmatched_removals == 1
    mirror.check_invariants()


def test_clear_and_reset_touch_one_publisher_only():
    mirror = MirrorIndex()
    mirror.apply("a", [stored([1, 2])])
    mirror.apply("b", [stored([1, 2])])
    mirror.apply("a", [AllBlocksCleared(), stored([7])])
    assert mirror.longest_prefix([1, 2]) == {"a": 0, "b": 2}
    assert mirror.blocks("a") == {(7, 0, MEDIUM_GPU): 1}
    mirror.remove_publisher("b")
    assert mirror.longest_prefix([1]) == {"a": 0}
    mirror.check_invariants()
    with pytest.raises(InvalidArgumentError):
        mirror.apply("a", ["nonsense"])  # type: ignore[list-item]


def test_mirror_follows_a_random_stream_exactly(rng):
    engines = {f"p{i}": FakeEngine(random.Random(rng.random()), num_groups=2) for i in range(3)}
    mirror = MirrorIndex()
    for _ in range(300):
        for publisher_id, engine in engines.items():
            engine.random_step()
            mirror.apply(publisher_id, engine.take_events())
        mirror.check_invariants()
    for publisher_id, engine in engines.items():
        assert mirror.blocks(publisher_id) == index_counts(engine.snapshot())
    assert mirror.num_unmatched_removals == 0


def test_compaction_merges_chains_and_keeps_the_blocks(rng):
    engine = FakeEngine(rng)
    for _ in range(50):
        engine.store()
    records = engine.snapshot()  # one record per block
    compacted = compact_stored(records)
    assert len(compacted) < len(records)
    assert index_counts(compacted) == index_counts(records)
    for record in compacted:
        assert len(record.token_ids) == len(record.block_hashes) * record.block_size
    # Different group or medium never merges; extra keys are padded when merged.
    a = stored([1])._replace(extra_keys=[("lora", 1)])
    b = stored([2], parent=1)
    c = stored([3], parent=2, group=1)
    merged = compact_stored([a, b, c])
    assert [r.block_hashes for r in merged] == [[h(1), h(2)], [h(3)]]
    assert merged[0].extra_keys == [("lora", 1), None]
    events = snapshot_events([a, b])
    assert isinstance(events[0], AllBlocksCleared)
    assert index_counts(stored_from_snapshot_events(events)) == index_counts([a, b])
    with pytest.raises(InvalidArgumentError):
        stored_from_snapshot_events([a])


def test_config_defaults_and_validation():
    config = KVEventsConfig()
    assert config.endpoint == "tcp://127.0.0.1:5557" and config.replay_endpoint is None
    assert not config.allow_remote
    assert config.buffer_steps == 10_000 and config.wire_form == "map"
    assert config.data_parallel_rank == 0
    with pytest.raises(TypeError):
        KVEventsConfig("tcp://*:1")  # type: ignore[misc]  # keyword-only
    for bad in (
        {"buffer_steps": 0},
        {"max_queue_size": -1},
        {"hwm": True},
        {"wire_form": "json"},
        {"endpoint": ""},
        {"data_parallel_rank": -1},
        {"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5557", "allow_remote": True},
    ):
        with pytest.raises(ConfigError):
            KVEventsConfig(**bad)


@pytest.mark.parametrize("endpoint", [
    "tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557", "tcp://*:*", "tcp://eth0:*",
])
@pytest.mark.parametrize("field", ["endpoint", "replay_endpoint"])
def test_binding_beyond_loopback_is_an_explicit_choice(endpoint, field):
    """Event messages carry prompt token ids without authentication: a socket reachable
    from other hosts needs allow_remote=True; loopback, ipc and connecting endpoints
    (a forwarder's address) do not."""
    other = {"endpoint": "tcp://127.0.0.1:*"} if field == "replay_endpoint" else {}
    with pytest.raises(ConfigError, match="allow_remote=True"):
        KVEventsConfig(**{field: endpoint}, **other)
    assert getattr(KVEventsConfig(**{field: endpoint}, **other, allow_remote=True),
                   field) == endpoint
    for fine in ("tcp://127.0.0.1:5557", "tcp://[::1]:*", "ipc:///tmp/kv",
                 "tcp://10.0.0.1:5557"):
        assert getattr(KVEventsConfig(**{field: fine}, **other), field) == fine


def test_bind_or_connect_and_topic():
    assert should_bind("tcp://*:5557")
    assert should_bind("tcp://127.0.0.1:*")
    assert should_bind("tcp://[::]:5557")
    assert should_bind("ipc:///tmp/kv")
    assert should_bind("inproc://kv")
    assert not should_bind("tcp://10.0.0.1:5557")
    assert should_bind("tcp://127.0.0.1:5557") and should_bind("tcp://[::1]:5557")
    assert kv_topic("10.0.0.7", "Qwen/Qwen3-0.6B") == "kv@10.0.0.7@Qwen/Qwen3-0.6B"


def test_without_the_extras_imports_work_and_use_says_what_to_install():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['zmq'] = None; sys.modules['msgpack'] = None\n"
        "import pagedkv, pagedkv.events.publisher, pagedkv.events.subscriber\n"
        "from pagedkv.errors import MissingDependencyError\n"
        "from pagedkv.events.config import KVEventsConfig\n"
        "from pagedkv.events.publisher import ZmqEventPublisher\n"
        "from pagedkv.events.wire import encode_batch\n"
        "for call in (lambda: ZmqEventPublisher(KVEventsConfig()),\n"
        "             lambda: encode_batch([], timestamp_s=0.0)):\n"
        "    try:\n"
        "        call()\n"
        "    except MissingDependencyError as exc:\n"
        '        assert "pagedkv[events]" in str(exc), exc\n'
        "    else:\n"
        "        raise SystemExit('no MissingDependencyError')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
