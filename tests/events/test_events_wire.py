"""Golden bytes of vLLM's KV-cache event wire format, both forms, and round trips."""

from __future__ import annotations

import pytest

pytest.importorskip("msgpack")

from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import InvalidArgumentError
from pagedkv.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored
from pagedkv.events.wire import (
    BatchEncoder,
    EventBatch,
    decode_batch,
    decode_seq,
    encode_batch,
    encode_seq,
    wire_hash,
)

HASH_A = 7322446309363477352
HASH_B = 17027874615116373601
TOKENS = list(range(1000, 1032))

STORED = BlockStored(
    block_hashes=[HASH_A, HASH_B],  # ints pass through the encoder unchanged
    parent_block_hash=None,
    token_ids=TOKENS,
    block_size=16,
    lora_id=None,
    medium=MEDIUM_GPU,
    lora_name=None,
    extra_keys=[None, None],
    group_idx=0,
    kv_cache_spec_kind="full_attention",
)
REMOVED = BlockRemoved(block_hashes=[HASH_B], medium=MEDIUM_GPU, group_idx=0)

GOLDEN_MAP = [
    (
        [STORED], 1700000000.5, 0,
        "93cb41d954fc4020000091de000ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
        "92cf659e8e1f547aeb68cfec4f29beb1e71e61b1706172656e745f626c6f636b5f68617368c0a9746f6b656e"
        "5f696473dc0020cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3cd"
        "03f4cd03f5cd03f6cd03f7cd03f8cd03f9cd03facd03fbcd03fccd03fdcd03fecd03ffcd0400cd0401cd0402"
        "cd0403cd0404cd0405cd0406cd0407aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3"
        "475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63"
        "616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00",
    ),
    (
        [REMOVED], 1700000001.5, 0,
        "93cb41d954fc406000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391"
        "cfec4f29beb1e71e61a66d656469756da3475055a967726f75705f6964780000",
    ),
    (
        [AllBlocksCleared()], 1700000002.5, 1,
        "93cb41d954fc40a000009181a474797065b0416c6c426c6f636b73436c656172656401",
    ),
]  # fmt: skip

GOLDEN_ARRAY = [
    (
        [STORED], 1700000000.5, 0,
        "93cb41d954fc40200000919cab426c6f636b53746f72656492cf659e8e1f547aeb68cfec4f29beb1e71e61c0"
        "dc0020cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3cd03f4cd03"
        "f5cd03f6cd03f7cd03f8cd03f9cd03facd03fbcd03fccd03fdcd03fecd03ffcd0400cd0401cd0402cd0403cd"
        "0404cd0405cd0406cd040710c0a3475055c092c0c000ae66756c6c5f617474656e74696f6ec000",
    ),
    (
        [REMOVED], 1700000001.5, 0,
        "93cb41d954fc406000009194ac426c6f636b52656d6f76656491cfec4f29beb1e71e61a34750550000",
    ),
    (
        [AllBlocksCleared()], 1700000002.5, 1,
        "93cb41d954fc40a000009191b0416c6c426c6f636b73436c656172656401",
    ),
]  # fmt: skip


def as_decoded(event):
    """The record as the decoder returns it: hashes as their 8 wire bytes."""
    if isinstance(event, AllBlocksCleared):
        return event
    fixed = event._replace(block_hashes=[h.to_bytes(8, "big") for h in event.block_hashes])
    if isinstance(event, BlockStored) and event.parent_block_hash is not None:
        fixed = fixed._replace(parent_block_hash=event.parent_block_hash.to_bytes(8, "big"))
    return fixed


@pytest.mark.parametrize(("form", "golden"), [("map", GOLDEN_MAP), ("array", GOLDEN_ARRAY)])
def test_golden_bytes_encode_exactly(form, golden):
    for events, ts, rank, hex_payload in golden:
        payload = encode_batch(events, timestamp_s=ts, data_parallel_rank=rank, form=form)
        assert payload.hex() == hex_payload


@pytest.mark.parametrize(("form", "golden"), [("map", GOLDEN_MAP), ("array", GOLDEN_ARRAY)])
def test_golden_bytes_decode_back(form, golden):
    for events, ts, rank, hex_payload in golden:
        batch = decode_batch(bytes.fromhex(hex_payload))
        assert batch == EventBatch(ts, [as_decoded(e) for e in events], rank)
        # Decoded records re-encode to the very same bytes.
        again = encode_batch(batch.events, timestamp_s=ts, data_parallel_rank=rank, form=form)
        assert again.hex() == hex_payload


def test_full_digests_are_cut_to_their_low_64_bits():
    digest_a = bytes(range(24)) + HASH_A.to_bytes(8, "big")
    digest_b = b"\x99" * 24 + HASH_B.to_bytes(8, "big")
    stored = STORED._replace(block_hashes=[digest_a, digest_b])
    payload = encode_batch([stored], timestamp_s=1700000000.5, data_parallel_rank=0)
    assert payload.hex() == GOLDEN_MAP[0][3]
    assert wire_hash(digest_a) == HASH_A
    assert wire_hash(HASH_B) == HASH_B


def test_map_form_omits_only_defaulted_fields():
    bare = STORED._replace(extra_keys=None, kv_cache_spec_kind=None, parent_block_hash=HASH_A)
    payload = encode_batch([bare], timestamp_s=1.0)
    assert b"extra_keys" not in payload and b"kv_cache_spec_kind" not in payload
    assert b"lora_id" in payload and b"lora_name" in payload and b"group_idx" in payload
    # The header is map16 even for the 9 fields left.
    assert payload[11:14] == b"\xde\x00\x09"
    windowed = STORED._replace(
        kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=4096, group_idx=1
    )
    decoded = decode_batch(encode_batch([windowed], timestamp_s=1.0)).events[0]
    assert decoded == as_decoded(windowed)
    assert decode_batch(payload).events[0] == as_decoded(bare)


def test_sequence_frames_are_8_byte_big_endian():
    assert encode_seq(0) == bytes(8)
    assert encode_seq(258) == b"\x00" * 6 + b"\x01\x02"
    assert decode_seq(encode_seq(2**64 - 2)) == 2**64 - 2
    with pytest.raises(InvalidArgumentError):
        decode_seq(b"\x01")


def test_old_short_arrays_decode_with_defaults():
    msgpack = pytest.importorskip("msgpack")
    # vLLM 0.9-era BlockStored: six fields, no medium/lora_name/extra_keys/group.
    payload = msgpack.packb([2.0, [["BlockStored", [HASH_A], None, TOKENS[:16], 16, None]], None])
    (event,) = decode_batch(payload).events
    assert event == BlockStored(
        [HASH_A.to_bytes(8, "big")], None, TOKENS[:16], 16, None, None, None, None, 0
    )


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # never-used msgpack byte
        bytes.fromhex("92cb41d954fc40a0000090"),  # two elements, not three
        bytes.fromhex("93cb41d954fc40a000009181a474797065a3466f6f01"),  # type "Foo"
        bytes.fromhex("93cb41d954fc40a00000918100c0"),  # map without "type"
    ],
)
def test_malformed_payloads_raise_invalid_argument(payload):
    with pytest.raises(InvalidArgumentError):
        decode_batch(payload)


def test_encoder_rejects_non_records():
    with pytest.raises(InvalidArgumentError):
        encode_batch([("BlockStored",)], timestamp_s=0.0)  # type: ignore[list-item]


u64 = st.integers(min_value=0, max_value=2**64 - 1)
stored_events = st.builds(
    BlockStored,
    block_hashes=st.lists(u64, min_size=1, max_size=4),
    parent_block_hash=st.none() | u64,
    token_ids=st.lists(st.integers(0, 2**31 - 1), max_size=8),
    block_size=st.integers(1, 512),
    lora_id=st.none() | st.integers(0, 100),
    medium=st.none() | st.sampled_from(["GPU", "CPU"]),
    lora_name=st.none() | st.text(max_size=8),
    extra_keys=st.none() | st.lists(st.none() | st.lists(st.text(max_size=4), max_size=2)),
    group_idx=st.integers(0, 5),
    kv_cache_spec_kind=st.none() | st.sampled_from(["full_attention", "sliding_window"]),
    kv_cache_spec_sliding_window=st.none() | st.integers(1, 8192),
    # The array form (vLLM <= 0.23) has no lookahead field: see the map-only test below.
    lookahead_token_ids=st.none(),
)
removed_events = st.builds(
    BlockRemoved,
    block_hashes=st.lists(u64, min_size=1, max_size=4),
    medium=st.none() | st.just("GPU"),
    group_idx=st.integers(0, 5),
)
any_event = stored_events | removed_events | st.just(AllBlocksCleared())


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(any_event, max_size=20),
    ts=st.floats(allow_nan=False, allow_infinity=False),
    rank=st.none() | st.integers(0, 64),
    form=st.sampled_from(["map", "array"]),
)
def test_round_trip_both_forms(events, ts, rank, form):
    payload = BatchEncoder(form).encode(events, timestamp_s=ts, data_parallel_rank=rank)
    batch = decode_batch(payload)
    assert batch == EventBatch(ts, [as_decoded(e) for e in events], rank)
    assert encode_batch(batch.events, timestamp_s=ts, data_parallel_rank=rank, form=form) == payload


@settings(max_examples=40, deadline=None)
@given(
    event=stored_events,
    ahead=st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4), max_size=4),
)
def test_round_trip_map_form_with_lookahead_tokens(event, ahead):
    event = event._replace(lookahead_token_ids=ahead)
    payload = encode_batch([event], timestamp_s=0.0)
    batch = decode_batch(payload)
    assert batch.events == [as_decoded(event)]
    assert encode_batch(batch.events, timestamp_s=0.0) == payload
