"""Prefix-index snapshots: the whole index as one message, tied to a sequence number.

A snapshot lets a subscriber that joins late (or lost more history than the replay buffer
holds) rebuild a publisher's index without history. It travels as an ordinary event
payload, ``[timestamp, [AllBlocksCleared, BlockStored, ...], dp_rank]``, so any decoder
of the wire format can apply it: "forget what you knew, then these blocks are stored".

Protocol on the replay (ROUTER) socket, beside vLLM's replay requests::

    request   DEALER -> ROUTER   [b"", SNAPSHOT_REQUEST]
    reply     ROUTER -> DEALER   [b"", SNAPSHOT_REPLY, seq (8-byte BE), payload]
    no snapshot available        [b"", SNAPSHOT_REPLY, 0xFF x 8, b""]

``seq`` is the number of the next live batch: the snapshot reflects every batch numbered
below it, so a subscriber applies the snapshot and then live batches from ``seq`` on.
``SNAPSHOT_REQUEST`` is 16 bytes long, so it can never be taken for an 8-byte replay
request by a publisher that does not know it (that publisher answers with its end-of-replay
marker, which a subscriber reads as "no snapshot").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pagedkv.core.records import AllBlocksCleared, BlockStored, KVCacheEvent
from pagedkv.errors import InvalidArgumentError

__all__ = [
    "SNAPSHOT_REPLY",
    "SNAPSHOT_REQUEST",
    "Snapshot",
    "compact_stored",
    "snapshot_events",
    "stored_from_snapshot_events",
]

SNAPSHOT_REQUEST = b"pagedkv.snapshot"
SNAPSHOT_REPLY = b"pagedkv.snapshot"


class Snapshot(NamedTuple):
    """The prefix index as stored-block records, and the first sequence number after it."""

    next_seq: int
    stored: list[BlockStored]


def compact_stored(records: Iterable[BlockStored]) -> list[BlockStored]:
    """Merge each record into the one before it when it continues that chain.

    A record continues the previous one when its parent is the previous record's last
    hash and block size, LoRA, medium, group and spec annotations are equal; the merged
    record lists both records' hashes, tokens and extra keys. The set of stored blocks is
    unchanged, and parents stay before children. O(total blocks).

    >>> a = BlockStored([b"1"], None, [1, 2], 2, None, "GPU", None, None, 0)
    >>> b = BlockStored([b"2"], b"1", [3, 4], 2, None, "GPU", None, None, 0)
    >>> compact_stored([a, b])[0].block_hashes
    [b'1', b'2']
    """
    out: list[BlockStored] = []
    for record in records:
        if out and _continues(out[-1], record):
            last = out[-1]
            if last.extra_keys is None and record.extra_keys is None:
                extra_keys = None
            else:
                extra_keys = [
                    *(last.extra_keys or [None] * len(last.block_hashes)),
                    *(record.extra_keys or [None] * len(record.block_hashes)),
                ]
            out[-1] = last._replace(
                block_hashes=[*last.block_hashes, *record.block_hashes],
                token_ids=[*last.token_ids, *record.token_ids],
                extra_keys=extra_keys,
            )
        else:
            out.append(record)
    return out


def _continues(last: BlockStored, record: BlockStored) -> bool:
    return (
        record.parent_block_hash is not None
        and bool(last.block_hashes)
        and record.parent_block_hash == last.block_hashes[-1]
        and record.block_size == last.block_size
        and record.lora_id == last.lora_id
        and record.medium == last.medium
        and record.lora_name == last.lora_name
        and record.group_idx == last.group_idx
        and record.kv_cache_spec_kind == last.kv_cache_spec_kind
        and record.kv_cache_spec_sliding_window == last.kv_cache_spec_sliding_window
    )


def snapshot_events(stored: Sequence[BlockStored]) -> list[KVCacheEvent]:
    """The events a snapshot payload carries: a reset, then ``stored`` (compacted)."""
    return [AllBlocksCleared(), *compact_stored(stored)]


def stored_from_snapshot_events(events: Sequence[KVCacheEvent]) -> list[BlockStored]:
    """Inverse of :func:`snapshot_events` (up to compaction).

    Raises InvalidArgumentError unless ``events`` is one reset followed by stored records.
    """
    if not events or type(events[0]) is not AllBlocksCleared:
        raise InvalidArgumentError("a snapshot payload starts with AllBlocksCleared")
    stored: list[BlockStored] = []
    for event in events[1:]:
        if type(event) is not BlockStored:
            raise InvalidArgumentError(f"a snapshot holds only BlockStored events, got {event!r}")
        stored.append(event)
    return stored
