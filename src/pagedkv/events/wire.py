"""vLLM's KV-cache event wire format: encode and decode one batch of events.

A ZeroMQ message carries one batch in three frames::

    topic (bytes) | seq (8-byte big-endian unsigned) | payload (msgpack)

and the payload is the msgpack array ``[timestamp (float64), [event, ...], dp_rank (int|nil)]``.
Each event has one of two forms:

``"map"`` (vLLM >= 0.24)
    a map whose first key is ``"type"``, then the fields in declaration order. Fields
    whose value is their default (``None`` for ``extra_keys``, ``kv_cache_spec_kind``,
    ``kv_cache_spec_sliding_window``, ``lookahead_token_ids``) are left out; every other
    field, ``lora_id`` included, is always written. A ``BlockStored`` map always has a map16 header
    (``de 00 nn``) whatever its field count, as vLLM writes it; the other kinds use a
    fixmap header.
``"array"`` (vLLM <= 0.23)
    ``[tag, field, field, ...]`` with every field present.

Block hashes go on the wire as unsigned 64-bit ints: the low 64 bits, big-endian, of the
digest (``int.from_bytes(digest[-8:], "big")``). Decoded records carry each hash as those
8 bytes, so decoding then re-encoding reproduces the payload byte for byte.

Encoding and decoding need the ``msgpack`` extra (``pip install 'pagedkv[events]'``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

from pagedkv.core.records import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent, WireForm
from pagedkv.errors import InvalidArgumentError, require

__all__ = [
    "END_OF_REPLAY",
    "BatchEncoder",
    "EventBatch",
    "decode_batch",
    "decode_seq",
    "encode_batch",
    "encode_seq",
    "wire_hash",
]

END_OF_REPLAY = b"\xff" * 8
"""Sequence frame of the message that ends a replay (and of an unavailable snapshot)."""

_SEQ_BYTES = 8
_BLOCK_STORED = "BlockStored"
_BLOCK_REMOVED = "BlockRemoved"
_ALL_BLOCKS_CLEARED = "AllBlocksCleared"
# A fixmap with the single pair "type": "AllBlocksCleared".
_CLEARED_MAP = b"\x81\xa4type\xb0AllBlocksCleared"
_MAP16 = b"\xde"
_ARRAY16 = 0xDC


class EventBatch(NamedTuple):
    """One decoded payload: when it was published, its events, and the sender's DP rank."""

    timestamp_s: float
    events: list[KVCacheEvent]
    data_parallel_rank: int | None


def wire_hash(block_hash: bytes | int) -> int:
    """The unsigned 64-bit int that represents ``block_hash`` on the wire.

    Bytes keep their low 64 bits read big-endian; ints pass through unchanged.

    >>> wire_hash(bytes(24) + (7322446309363477352).to_bytes(8, "big"))
    7322446309363477352
    >>> wire_hash(5)
    5
    """
    if isinstance(block_hash, int):
        return block_hash
    return int.from_bytes(block_hash[-8:], "big")


def _wire_hashes(block_hashes: Sequence[bytes | int]) -> list[int]:
    """:func:`wire_hash` of each hash (inlined: this runs once per encoded block)."""
    return [
        h if isinstance(h, int) else int.from_bytes(h[-8:], "big")
        for h in block_hashes
    ]


def encode_seq(seq: int) -> bytes:
    """Sequence number as the 8-byte big-endian frame. O(1)."""
    return seq.to_bytes(_SEQ_BYTES, "big")


def decode_seq(frame: bytes) -> int:
    """Inverse of :func:`encode_seq`; raises InvalidArgumentError unless 8 bytes long."""
    if len(frame) != _SEQ_BYTES:
        raise InvalidArgumentError(
            f"a sequence frame is {_SEQ_BYTES} bytes, got {len(frame)}: {bytes(frame)!r}"
        )
    return int.from_bytes(frame, "big")


@functools.cache
def _msgpack() -> Any:
    return require("msgpack", "events", "KV-cache event wire encoding")


class BatchEncoder:
    """Encodes event batches into payloads; one instance per thread (not thread-safe).

    Holds a reusable msgpack packer, so it is cheaper than :func:`encode_batch` in a loop.
    Cost: O(total hashes + tokens + extra keys) per batch.
    """

    __slots__ = ("_form", "_pack")

    def __init__(self, form: WireForm = "map") -> None:
        if form not in ("map", "array"):
            raise InvalidArgumentError(f"wire form must be 'map' or 'array', got {form!r}")
        self._form = form
        self._pack = _msgpack().Packer(autoreset=True).pack

    @property
    def form(self) -> WireForm:
        return self._form

    def encode(
        self,
        events: Sequence[KVCacheEvent],
        *,
        timestamp_s: float,
        data_parallel_rank: int | None,
    ) -> bytes:
        """The payload ``[timestamp_s, [events], data_parallel_rank]`` in this form.

        Raises InvalidArgumentError for an object that is not one of the three records.
        """
        pack = self._pack
        if self._form == "array":
            payload: bytes = pack(
                [float(timestamp_s), [_as_array(event) for event in events], data_parallel_rank]
            )
            return payload
        parts = [b"\x93", pack(float(timestamp_s)), _array_header(len(events))]
        for event in events:
            parts.append(self._map_event(event))
        parts.append(pack(data_parallel_rank))
        return b"".join(parts)

    def _map_event(self, event: KVCacheEvent) -> bytes:
        if isinstance(event, BlockStored):
            return self._stored_map(event)
        if isinstance(event, BlockRemoved):
            body: bytes = self._pack(
                {
                    "type": _BLOCK_REMOVED,
                    "block_hashes": _wire_hashes(event.block_hashes),
                    "medium": event.medium,
                    "group_idx": event.group_idx,
                }
            )
            return body
        if isinstance(event, AllBlocksCleared):
            return _CLEARED_MAP
        raise InvalidArgumentError(f"not a KV-cache event record: {event!r}")

    def _stored_map(self, event: BlockStored) -> bytes:
        parent = event.parent_block_hash
        # Keys and values alternate in one flat array; its header is swapped for the
        # map16 header below, so msgpack writes everything else in a single call.
        items: list[Any] = [
            "type", _BLOCK_STORED,
            "block_hashes", _wire_hashes(event.block_hashes),
            "parent_block_hash", None if parent is None else wire_hash(parent),
            "token_ids", event.token_ids,
            "block_size", event.block_size,
            "lora_id", event.lora_id,
            "medium", event.medium,
            "lora_name", event.lora_name,
        ]  # fmt: skip
        if event.extra_keys is not None:
            items += ("extra_keys", event.extra_keys)
        items += ("group_idx", event.group_idx)
        if event.kv_cache_spec_kind is not None:
            items += ("kv_cache_spec_kind", event.kv_cache_spec_kind)
        if event.kv_cache_spec_sliding_window is not None:
            items += ("kv_cache_spec_sliding_window", event.kv_cache_spec_sliding_window)
        if event.lookahead_token_ids is not None:
            items += ("lookahead_token_ids", event.lookahead_token_ids)
        body: bytes = self._pack(items)
        # At least 9 pairs, so 18+ items: always an array16 header (3 bytes) to strip.
        assert body[0] == _ARRAY16
        return _MAP16 + (len(items) // 2).to_bytes(2, "big") + body[3:]


def _array_header(num_items: int) -> bytes:
    if num_items < 16:
        return bytes((0x90 | num_items,))
    if num_items < 1 << 16:
        return b"\xdc" + num_items.to_bytes(2, "big")
    return b"\xdd" + num_items.to_bytes(4, "big")


def _as_array(event: KVCacheEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        stored = event
        parent = stored.parent_block_hash
        return [
            _BLOCK_STORED,
            _wire_hashes(stored.block_hashes),
            None if parent is None else wire_hash(parent),
            stored.token_ids,
            stored.block_size,
            stored.lora_id,
            stored.medium,
            stored.lora_name,
            stored.extra_keys,
            stored.group_idx,
            stored.kv_cache_spec_kind,
            stored.kv_cache_spec_sliding_window,
        ]
    if isinstance(event, BlockRemoved):
        removed = event
        return [
            _BLOCK_REMOVED,
            _wire_hashes(removed.block_hashes),
            removed.medium,
            removed.group_idx,
        ]
    if isinstance(event, AllBlocksCleared):
        return [_ALL_BLOCKS_CLEARED]
    raise InvalidArgumentError(f"not a KV-cache event record: {event!r}")


def encode_batch(
    events: Sequence[KVCacheEvent],
    *,
    timestamp_s: float,
    data_parallel_rank: int | None = 0,
    form: WireForm = "map",
) -> bytes:
    """Encode one batch as a payload in ``form``; see :meth:`BatchEncoder.encode`.

    >>> encode_batch([AllBlocksCleared()], timestamp_s=1700000002.5, data_parallel_rank=1).hex()
    '93cb41d954fc40a000009181a474797065b0416c6c426c6f636b73436c656172656401'
    """
    return BatchEncoder(form).encode(
        events, timestamp_s=timestamp_s, data_parallel_rank=data_parallel_rank
    )


# --- decoding -----------------------------------------------------------------------------

_STORED_FIELDS = BlockStored._fields
_STORED_DEFAULTS: dict[str, Any] = {
    "lora_id": None,
    "medium": None,
    "lora_name": None,
    "extra_keys": None,
    "group_idx": 0,
    "kv_cache_spec_kind": None,
    "kv_cache_spec_sliding_window": None,
    "lookahead_token_ids": None,
}
_REMOVED_DEFAULTS: dict[str, Any] = {"medium": None, "group_idx": 0}


def _hash_bytes(value: Any) -> bytes:
    if type(value) is not int or not 0 <= value < 1 << 64:
        raise InvalidArgumentError(f"a block hash on the wire is a u64 int, got {value!r}")
    return value.to_bytes(8, "big")


def _decode_fields(
    name: str, fields: tuple[str, ...], defaults: dict[str, Any], values: dict[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in fields:
        if field in values:
            out[field] = values[field]
        elif field in defaults:
            out[field] = defaults[field]
        else:
            raise InvalidArgumentError(f"{name} event without its {field!r} field: {values!r}")
    return out


def _decode_stored(values: dict[str, Any]) -> BlockStored:
    fields = _decode_fields(_BLOCK_STORED, _STORED_FIELDS, _STORED_DEFAULTS, values)
    fields["block_hashes"] = [_hash_bytes(h) for h in fields["block_hashes"]]
    parent = fields["parent_block_hash"]
    fields["parent_block_hash"] = None if parent is None else _hash_bytes(parent)
    return BlockStored(**fields)


def _decode_removed(values: dict[str, Any]) -> BlockRemoved:
    fields = _decode_fields(_BLOCK_REMOVED, BlockRemoved._fields, _REMOVED_DEFAULTS, values)
    fields["block_hashes"] = [_hash_bytes(h) for h in fields["block_hashes"]]
    return BlockRemoved(**fields)


def _decode_event(raw: Any) -> KVCacheEvent:
    if isinstance(raw, dict):
        tag = raw.get("type")
        values = raw
    elif isinstance(raw, list) and raw:
        # Older releases sent fewer trailing fields; missing ones take their defaults.
        tag = raw[0]
        names = {_BLOCK_STORED: _STORED_FIELDS, _BLOCK_REMOVED: BlockRemoved._fields}.get(tag, ())
        if len(raw) - 1 > len(names):
            raise InvalidArgumentError(f"{tag} array has {len(raw) - 1} fields: {raw!r}")
        values = dict(zip(names, raw[1:], strict=False))
    else:
        raise InvalidArgumentError(f"an event is a map or a tagged array, got {raw!r}")
    if tag == _BLOCK_STORED:
        return _decode_stored(values)
    if tag == _BLOCK_REMOVED:
        return _decode_removed(values)
    if tag == _ALL_BLOCKS_CLEARED:
        return AllBlocksCleared()
    raise InvalidArgumentError(f"unknown KV-cache event type {tag!r}")


def decode_batch(payload: bytes) -> EventBatch:
    """Decode a payload of either form (forms may even mix within one batch).

    Map events may omit any field that has a default; unknown map keys are ignored.
    Raises InvalidArgumentError for anything that is not a well-formed batch.
    Cost: O(payload size).
    """
    msgpack = _msgpack()
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise InvalidArgumentError(f"payload is not valid msgpack: {exc}") from exc
    if not isinstance(raw, list) or len(raw) != 3 or not isinstance(raw[1], list):
        raise InvalidArgumentError(
            f"a payload is [timestamp, [events], dp_rank], got {type(raw).__name__} {raw!r:.200}"
        )
    timestamp, events, rank = raw
    if not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool):
        raise InvalidArgumentError(f"payload timestamp is not a number: {timestamp!r}")
    if rank is not None and type(rank) is not int:
        raise InvalidArgumentError(f"payload data_parallel_rank is not an int: {rank!r}")
    return EventBatch(float(timestamp), [_decode_event(event) for event in events], rank)
