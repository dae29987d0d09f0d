"""Compact JSON encoding of one seed's vLLM answers (see ``conformance/transcript.py``).

Every value the workload reads from the reference side is kept exactly, with its Python
types (a block table is a tuple of lists, a copy a tuple), but stored compactly:

- a block hash is written to the seed's binary blob the first time the seed meets it (the
  JSON holds minus its length) and as its index in the seed's hash table afterwards;
- a request's block hashes are stored as the length of the prefix it shares with the last
  list returned for that request plus the new entries;
- a snapshot is stored as the fields that changed since the previous operation's; the free
  queue as the blocks that left it plus the blocks appended to its tail (when that
  describes the new order, else in full), the cached blocks and the block tables as
  additions and removals; the event payload (new each operation) as its length, its bytes
  in the blob (raw msgpack compresses far better than base64 text).

Worked example (one hash table shared by encoder and decoder)::

    >>> enc = SeedCodec()
    >>> h = bytes(range(32))
    >>> data = enc.encode_result("h", [h, h], ("r0",))
    >>> data                                      # 0 shared, new 32-byte hash, hash 0
    [0, -32, 0]
    >>> SeedCodec(bytes(enc.blob)).decode_result("h", data, ("r0",)) == [h, h]
    True
    >>> enc.encode_result("h", [h, h], ("r0",))   # same list again: shares 2 entries
    [2]
"""

from __future__ import annotations

from typing import Any

from conformance.model import Snapshot

__all__ = ["METHOD_CODES", "VOID_METHODS", "SeedCodec"]

#: One letter per side method, in the transcript's per-operation call string.
METHOD_CODES: dict[str, str] = {
    "new_request": "N",
    "append_token": "A",
    "lookup": "L",
    "truncate": "T",
    "allocate": "C",
    "pop_for_free": "P",
    "release_deferred": "R",
    "zero_from": "Z",
    "take_zeroing": "z",
    "take_copies": "c",
    "estimate": "e",
    "commit": "m",
    "free": "F",
    "preempt": "X",
    "reset": "r",
    "new_step": "S",
    "block_hashes": "h",
    "lookup_groups": "G",
    "take_offloads": "o",
    "finalize_tails": "x",
    "evict": "E",
}
#: Methods that return nothing: only their call letter is stored.
VOID_METHODS = frozenset("NARZmFXSE")


class SeedCodec:
    """Encoder or decoder state for one seed: the hash table, each request's last block
    hashes and the previous snapshot (the same state on both ends), and the seed's blob
    (written by an encoder, ``blob`` given to a decoder)."""

    def __init__(self, blob: bytes | None = None) -> None:
        self.blob = bytearray() if blob is None else bytearray(blob)
        self._pos = 0  # the decoder's read position in ``blob``
        self.hashes: list[bytes] = []
        self._index: dict[bytes, int] = {}
        self._last_hashes: dict[str, list[bytes]] = {}
        self.prev = Snapshot(num_free=-1, usage=-1.0, stats=(), free_order=())

    # ------------------------------------------------------------------ hashes

    def _put_bytes(self, data: bytes) -> int:
        self.blob += data
        return len(data)

    def _take_bytes(self, length: int) -> bytes:
        if self._pos + length > len(self.blob):
            raise ValueError("the seed's blob is shorter than its entries say")
        out = bytes(self.blob[self._pos : self._pos + length])
        self._pos += length
        return out

    def _put_hash(self, h: bytes) -> int:
        if not h:
            raise ValueError("an empty block hash cannot be stored")
        k = self._index.get(h)
        if k is not None:
            return k
        self._index[h] = len(self.hashes)
        self.hashes.append(h)
        return -self._put_bytes(h)

    def _get_hash(self, ref: int) -> bytes:
        if ref >= 0:
            return self.hashes[ref]
        h = self._take_bytes(-ref)
        self._index[h] = len(self.hashes)
        self.hashes.append(h)
        return h

    # ------------------------------------------------------------------ call results

    def encode_result(self, code: str, value: Any, args: tuple[Any, ...]) -> Any:
        """``value`` returned by the method with call letter ``code`` as a JSON value."""
        if code == "h":
            rid = args[0]
            old = self._last_hashes.get(rid, [])
            shared = 0
            while shared < min(len(old), len(value)) and old[shared] == value[shared]:
                shared += 1
            self._last_hashes[rid] = list(value)
            return [shared, *(self._put_hash(h) for h in value[shared:])]
        if code == "c":
            return [list(pair) for pair in value]
        return value  # ints, bools, None, lists and tuples of lists (JSON arrays)

    def decode_result(self, code: str, data: Any, args: tuple[Any, ...]) -> Any:
        """The value :meth:`encode_result` stored, with its original Python types."""
        if code == "h":
            shared, *new = data
            out = self._last_hashes.get(args[0], [])[:shared] + [self._get_hash(r) for r in new]
            self._last_hashes[args[0]] = out
            return list(out)
        if code in "LTG":
            return data[0], tuple(data[1])
        if code == "C":
            return None if data is None else tuple(data)
        if code == "c":
            return [tuple(pair) for pair in data]
        return data

    # ------------------------------------------------------------------ snapshots

    def encode_snapshot(self, snap: Snapshot) -> dict[str, Any]:
        """The fields of ``snap`` that changed since the previous snapshot."""
        prev, out = self.prev, {}
        if snap.num_free != prev.num_free:
            out["f"] = snap.num_free
        if snap.usage != prev.usage:
            out["u"] = snap.usage
        if snap.stats != prev.stats:
            out["st"] = list(snap.stats)
        if snap.free_order != prev.free_order:
            out["q"] = _queue_delta(prev.free_order, snap.free_order)
        if snap.cached != prev.cached:
            gone = sorted(b for b in prev.cached if snap.cached.get(b) != prev.cached[b])
            new = sorted(b for b in snap.cached if prev.cached.get(b) != snap.cached[b])
            out["c"] = {
                "-": [b for b in gone if b not in snap.cached],
                "+": [[b, snap.cached[b][0], self._put_hash(snap.cached[b][1])] for b in new],
            }
        if snap.tables != prev.tables:
            out["t"] = {
                "-": sorted(r for r in prev.tables if r not in snap.tables),
                "+": {r: list(t) for r, t in snap.tables.items() if prev.tables.get(r) != t},
            }
        if snap.events:
            out["ev"] = self._put_bytes(snap.events)
        self.prev = snap
        return out

    def decode_snapshot(self, data: dict[str, Any]) -> Snapshot:
        """The snapshot :meth:`encode_snapshot` stored (applied to the previous one)."""
        prev = self.prev
        cached = dict(prev.cached)
        if "c" in data:
            for b in data["c"]["-"]:
                del cached[b]
            for b, group, ref in data["c"]["+"]:
                cached[b] = (group, self._get_hash(ref))
        tables = dict(prev.tables)
        if "t" in data:
            for r in data["t"]["-"]:
                del tables[r]
            tables.update({r: tuple(t) for r, t in data["t"]["+"].items()})
        snap = Snapshot(
            num_free=data.get("f", prev.num_free),
            usage=data.get("u", prev.usage),
            stats=tuple(data["st"]) if "st" in data else prev.stats,
            free_order=_apply_queue_delta(prev.free_order, data["q"])
            if "q" in data
            else prev.free_order,
            cached=cached,
            tables=tables,
            events=self._take_bytes(data["ev"]) if "ev" in data else b"",
        )
        self.prev = snap
        return snap


def _queue_delta(old: tuple[int, ...], new: tuple[int, ...]) -> Any:
    """``{"-": left, "+": appended}`` when ``new`` is ``old`` less ``left`` plus
    ``appended`` at the tail, else ``new`` as a list."""
    new_set = set(new)
    left = [b for b in old if b not in new_set]
    kept = len(old) - len(left)
    left_set = set(left)
    if tuple(b for b in old if b not in left_set) == new[:kept]:
        return {"-": left, "+": list(new[kept:])}
    return list(new)


def _apply_queue_delta(old: tuple[int, ...], delta: Any) -> tuple[int, ...]:
    if isinstance(delta, list):
        return tuple(delta)
    left = set(delta["-"])
    return tuple(b for b in old if b not in left) + tuple(delta["+"])
