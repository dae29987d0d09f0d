"""Per-publisher state of a :class:`pagedkv.events.transport.Subscriber`: the status it
reports (:class:`SourceStatus`) and the sockets and repair bookkeeping it keeps."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from pagedkv.core.records import KVCacheEvent

__all__ = ["SourceState", "SourceStatus"]


class SourceStatus(NamedTuple):
    """Where the subscriber stands with one publisher."""

    publisher_id: str
    next_seq: int | None
    """Sequence number expected next (None before the first batch or snapshot)."""
    synced: bool
    """The mirror reflects every batch before ``next_seq``."""
    repairing: bool
    """A replay or snapshot request is outstanding."""
    num_batches: int
    """Batches applied (live and replayed)."""
    num_gaps: int
    num_replay_requests: int
    num_snapshots: int
    num_bad_messages: int


class SourceState:
    """Per-publisher sockets and repair state (mutated only by :class:`Subscriber`)."""

    def __init__(
        self, publisher_id: str, sub: Any, replay_endpoint: str | None, want_snapshot: bool
    ) -> None:
        self.publisher_id = publisher_id
        self.sub = sub
        self.replay_endpoint = replay_endpoint
        self.dealer: Any = None
        self.next_seq: int | None = None
        self.last_live_seq: int | None = None  # highest seq seen on the SUB socket
        self.quiet_since_s = time.monotonic()  # last live batch or finished repair
        self.synced = False
        self.pending: dict[int, list[KVCacheEvent]] = {}
        self.awaiting: str | None = None  # "replay" | "snapshot"
        self.request: list[bytes] = []
        self.deadline_s = 0.0
        self.attempts = 0
        self.snapshot_tried = False
        self.replay_hole = False  # the current replay skipped over a missing batch
        self.snapshot_unavailable = False
        self.want_snapshot = want_snapshot
        self.resync_after_s = 0.0  # when an unsynced source may ask for a snapshot again
        self.num_batches = 0
        self.num_gaps = 0
        self.num_replay_requests = 0
        self.num_snapshots = 0
        self.num_bad_messages = 0
        self.data_parallel_rank: int | None = None  # from the last decoded payload
        self.num_lost_live = 0  # batches missing between consecutive live batches
