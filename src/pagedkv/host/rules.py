"""Where a host continuation may end: the host hit rule for every group kind at once.

A hit of ``E`` blocks (``E * block_size`` tokens) is valid when every group holds what
its next token reads. Each group's manager says which table positions that is
(``hit_span``, :mod:`pagedkv.core.managers`): full attention every position ``[0, E)``, a
sliding window the positions inside the window before the hit's end, chunked local the
positions of the current chunk, a Mamba state the position ``E - 1`` only. A position
before the device hit's end (``first_block``) is served by the device hit's block there
(none where the device hit has a null); a position after it by a ready host key
``(block_hash, group)``. The continuation is the largest valid ``E`` within the limit;
the host part of group ``g`` is then the positions of its span at or after
``first_block``.

The scan runs left to right once, keeping per group the last position that cannot be
served; ``E`` is valid when no group's last unserved position lies inside its span. The
spans only move right as ``E`` grows, so once a group's last unserved position reaches
the start of its span at the limit nothing further can be valid and the scan stops (for
full attention: at its first host miss). O(positions scanned x groups).

Worked case (block 4; groups full attention, window 8, Mamba; a device hit of 1 block;
the host holds full-attention and window blocks 1..3 and the Mamba state after 12 tokens
(position 2); at most 4 blocks): ``E`` = 2 needs the Mamba state at position 1: missing;
``E`` = 3 needs full 0..2 (0 on the device), window 1..2, Mamba 2: valid; ``E`` = 4
needs the Mamba state at position 3: missing. The continuation ends at 3; the host part
is full ``[1, 2]``, window ``[1, 2]``, Mamba ``[2]``.

>>> ready = {(h, g) for h in (b"1", b"2", b"3") for g in (0, 1)} | {(b"2", 2)}
>>> spans = [lambda t: (0, t // 4), lambda t: (max(0, t - 7) // 4, t // 4),
...          lambda t: (max(0, t - 1) // 4, t // 4)]
>>> cont = find_continuation(ContinuationQuery(
...     block_hashes=[b"0", b"1", b"2", b"3", b"4"], spans=spans,
...     device_tables=([7], [7], [7]), first_block=1, block_size=4, end_block=4),
...     lambda key: ready_state(key in ready))
>>> cont.end_block, cont.starts
(3, (1, 1, 2))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagedkv.host.plans import LookupState

__all__ = ["Continuation", "ContinuationQuery", "find_continuation", "ready_state"]

_READY, _PENDING, _MISS = 0, 1, 2


def ready_state(ready: bool) -> LookupState:
    """HIT for True, MISS for False (for callers that know no pending keys)."""
    return LookupState.HIT if ready else LookupState.MISS


@dataclass(frozen=True, slots=True, kw_only=True)
class ContinuationQuery:
    """One lookup's inputs: the request's block hashes, per group the span rule
    (tokens -> ``(start, end)`` positions) and the device hit's blocks, the device hit's
    length in blocks, the block size, and the most blocks the whole hit may have
    (``end_block``)."""

    block_hashes: Sequence[bytes]
    spans: Sequence[Callable[[int], tuple[int, int]]]
    device_tables: Sequence[Sequence[int]]
    first_block: int
    block_size: int
    end_block: int


@dataclass(frozen=True, slots=True)
class Continuation:
    """The answer: the whole hit ends at ``end_block`` (``first_block`` when there is
    no host part); group ``g`` loads positions ``starts[g] .. end_block - 1``;
    ``num_pending_blocks`` more blocks would be valid once keys being stored are ready."""

    first_block: int
    end_block: int
    starts: tuple[int, ...]
    num_pending_blocks: int


def _last_unserved(device: Sequence[int], first: int) -> int:
    """The last position before ``first`` without a device block (-1: none)."""
    for p in range(first - 1, -1, -1):
        if p >= len(device) or not device[p]:
            return p
    return -1


def find_continuation(q: ContinuationQuery,
                      state: Callable[[tuple[bytes, int]], LookupState]) -> Continuation:
    """The longest valid host continuation of the device hit (module docstring).
    ``state(key)`` tells whether a host key is ready, pending or missing. No state
    change."""
    bs = q.block_size
    first = q.first_block
    end = min(q.end_block, len(q.block_hashes))
    groups = range(len(q.spans))
    spans = q.spans
    # Per group: last position not ready / last position missing (pending counts).
    not_ready = [_last_unserved(q.device_tables[g], first) for g in groups]
    missing = list(not_ready)
    limit_start = [spans[g](end * bs)[0] for g in groups] if end > first else []
    best = best_pending = first
    for p in range(first, end):
        h = q.block_hashes[p]
        for g in groups:
            s = state((h, g))
            if s is not LookupState.HIT:
                not_ready[g] = p
                if s is LookupState.MISS:
                    missing[g] = p
        e = p + 1
        ok = ok_pending = True
        for g in groups:
            start = spans[g](e * bs)[0]
            if not_ready[g] >= start:
                ok = False
            if missing[g] >= start:
                ok_pending = False
                break
        if ok:
            best = e
        if ok_pending:
            best_pending = e
        if any(missing[g] >= limit_start[g] for g in groups):
            break
    starts = tuple(max(first, spans[g](best * bs)[0]) for g in groups)
    return Continuation(first, best, starts, max(0, best_pending - best))
