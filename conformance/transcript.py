"""Recorded vLLM transcripts: the suite's comparisons without vLLM installed.

``python -m conformance --vllm-python VLLM_PY --record DIR`` drives vLLM's manager alone
through the suite's operations and writes, per layout, ``DIR/<layout>.jsonl.gz``: a header
line, then per seed one JSON line and a binary blob (new block hashes and event payloads,
in order), holding every answer vLLM gave (lookups, truncations,
allocations or refusals, deferred frees, blocks to zero, block copies,
``estimate_cached_tokens``, block hashes, prefix-cache resets) and the state after every
operation (free-block count, usage, prefix-cache statistics, free-queue order, the hash of
every cached block, every live block table, the encoded event payload), compactly
(``conformance/codec.py``).

``python -m conformance --replay DIR`` then runs the same workload with a
:class:`ReplaySide` in vLLM's place: it answers every call from the transcript, so the
workload takes the same path as it did against vLLM, and pagedkv is compared with vLLM's
recorded answers exactly as in a live run. Each operation also stores a CRC-32 of the
calls the workload made (method and arguments); a replay whose workload calls differ
stops with "the workload differs from the recorded one", a cue to record again.

Worked example (a recorded seed replayed against pagedkv)::

    >>> from conformance.layouts import layout_by_name
    >>> from conformance.pagedkv_side import PagedSide
    >>> lay = layout_by_name("full-4")
    >>> rec = Recorder(PagedSide(lay))      # any side can be recorded; CI records vLLM
    >>> _ = run_seed(lay, 3, 40, rec, None)
    >>> res = run_seed(lay, 3, 40, ReplaySide(rec.seed_record(3, 40)), PagedSide(lay))
    >>> res.divergence is None, res.num_ops
    (True, 40)
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from conformance.codec import METHOD_CODES, VOID_METHODS, SeedCodec
from conformance.layouts import Layout
from conformance.model import Snapshot
from conformance.workload import Mismatch, Side, run_seed

__all__ = [
    "FORMAT",
    "Recorder",
    "ReplaySide",
    "Transcript",
    "read_transcript",
    "transcript_path",
    "write_transcript",
]

#: Transcript format version (the header's ``format``).
FORMAT = 1


def _crc(crc: int, method: str, args: tuple[Any, ...]) -> int:
    return zlib.crc32(repr((method, args)).encode(), crc)


class Recorder:
    """Wraps a side (vLLM's) and records every answer it gives, operation by operation
    (an operation ends with the workload's snapshot)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self._codec = SeedCodec()
        self._check = SeedCodec()  # decodes every entry as a replay will, to verify it
        self._check.blob = self._codec.blob
        self._ops: list[dict[str, Any]] = []
        self._calls: list[str] = []
        self._results: list[Any] = []
        self._crc = 0

    def __getattr__(self, method: str) -> Callable[..., Any]:
        code = METHOD_CODES.get(method)
        if code is None:
            raise AttributeError(method)
        fn = getattr(self.inner, method)

        def call(*args: Any) -> Any:
            value = fn(*args)
            self._calls.append(code)
            self._crc = _crc(self._crc, method, args)
            if code not in VOID_METHODS:
                data = json.loads(json.dumps(self._codec.encode_result(code, value, args)))
                back = self._check.decode_result(code, data, args)
                if repr(back) != repr(value):
                    raise RuntimeError(f"{method}{args}: {value!r} reads back as {back!r}")
                self._results.append(data)
            return value

        return call

    def snapshot(self) -> Snapshot:
        snap: Snapshot = self.inner.snapshot()
        data = json.loads(json.dumps(self._codec.encode_snapshot(snap)))
        if self._check.decode_snapshot(data) != snap:
            raise RuntimeError(f"operation {len(self._ops)}: the snapshot does not read back")
        self._ops.append(
            {"m": "".join(self._calls), "r": self._results, "d": self._crc & 0xFFFF, "s": data}
        )
        self._calls, self._results, self._crc = [], [], 0
        return snap

    def seed_record(self, seed: int, num_ops: int) -> dict[str, Any]:
        """The seed's record (``ops`` JSON-ready, ``blob`` bytes); the recorder starts afresh
        for the next seed."""
        if len(self._ops) != num_ops:
            raise RuntimeError(f"seed {seed}: recorded {len(self._ops)} of {num_ops} ops")
        record = {"seed": seed, "ops": self._ops, "blob": bytes(self._codec.blob)}
        self._codec, self._check, self._ops = SeedCodec(), SeedCodec(), []
        self._check.blob = self._codec.blob
        return record


class ReplaySide:
    """Answers the workload's calls from one seed's record, as vLLM answered them.

    A call the record does not have at that point raises :class:`Mismatch` naming the
    operation: the workload changed since the transcript was recorded."""

    name = "vllm"

    def __init__(self, record: dict[str, Any]) -> None:
        self._ops: Iterator[dict[str, Any]] = iter(record["ops"])
        self._codec = SeedCodec(record["blob"])
        self._index = -1
        self._next_op()

    def _next_op(self) -> None:
        self._index += 1
        self._op = next(self._ops, {"m": "", "r": [], "d": 0, "s": {}})
        self._calls = iter(self._op["m"])
        self._results = iter(self._op["r"])
        self._crc = 0

    def _drift(self, what: str) -> Mismatch:
        return Mismatch(
            f"the workload differs from the recorded one at operation {self._index} "
            f"({what}); record the transcripts again (python -m conformance --record)"
        )

    def __getattr__(self, method: str) -> Callable[..., Any]:
        code = METHOD_CODES.get(method)
        if code is None:
            raise AttributeError(method)

        def call(*args: Any) -> Any:
            expected = next(self._calls, None)
            if expected != code:
                raise self._drift(f"it called {method}, the transcript has {expected!r}")
            self._crc = _crc(self._crc, method, args)
            if code in VOID_METHODS:
                return None
            return self._codec.decode_result(code, next(self._results), args)

        return call

    def snapshot(self) -> Snapshot:
        left = next(self._calls, None)
        if left is not None:
            raise self._drift(f"the transcript has a further call {left!r}")
        if self._crc & 0xFFFF != self._op["d"]:
            raise self._drift("same calls, other arguments")
        snap = self._codec.decode_snapshot(self._op["s"])
        self._next_op()
        return snap


@dataclass(frozen=True, slots=True, kw_only=True)
class Transcript:
    """One layout's transcript: its header and one record per seed."""

    header: dict[str, Any]
    seeds: list[dict[str, Any]]

    @property
    def num_ops(self) -> int:
        return sum(len(s["ops"]) for s in self.seeds)

    def call_counts(self) -> dict[str, int]:
        """How many of each call the transcript holds, by method name, plus
        ``allocate-refused`` (allocations vLLM refused) and ``events`` (non-empty event
        batches)."""
        names = {code: name for name, code in METHOD_CODES.items()}
        counts: dict[str, int] = {}
        for record in self.seeds:
            for op in record["ops"]:
                results = iter(op["r"])
                for code in op["m"]:
                    counts[names[code]] = counts.get(names[code], 0) + 1
                    if code not in VOID_METHODS and next(results) is None and code == "C":
                        counts["allocate-refused"] = counts.get("allocate-refused", 0) + 1
                counts["events"] = counts.get("events", 0) + ("ev" in op["s"])
        return counts


def transcript_path(directory: str, layout: Layout) -> str:
    """``DIR/<layout name, '/' as '_'>.jsonl.gz``."""
    return os.path.join(directory, layout.name.replace("/", "_") + ".jsonl.gz")


def layout_header(layout: Layout) -> dict[str, Any]:
    """What a transcript records of its layout (a replay refuses another layout)."""
    return {
        "name": layout.name,
        "groups": [[g.kind, g.block_size, g.window_tokens] for g in layout.groups],
        "num_blocks": layout.num_blocks,
        "max_model_len": layout.max_model_len,
        "prefix_match_unit": layout.prefix_match_unit,
        "num_hash_lookahead_tokens": layout.num_hash_lookahead_tokens,
        # Recorded only where set, so that earlier transcripts' headers still match.
        **({"num_prefill_lookahead_tokens": layout.num_prefill_lookahead_tokens}
           if layout.num_prefill_lookahead_tokens else {}),
        **({"use_eagle": True} if layout.use_eagle else {}),
        **({"connector": True} if layout.connector else {}),
    }


def write_transcript(path: str, header: dict[str, Any], seeds: list[dict[str, Any]]) -> int:
    """Write ``header`` as a JSON line, then per seed a JSON line (``blob`` its blob's
    length) followed by the blob's bytes, all gzip'd (byte-identical for the same
    content); returns the file's size in bytes."""
    parts = [json.dumps(header, sort_keys=True).encode(), b"\n"]
    for record in seeds:
        line = {**record, "blob": len(record["blob"])}
        parts += [json.dumps(line, separators=(",", ":")).encode(), b"\n", record["blob"]]
    data = gzip.compress(b"".join(parts), compresslevel=9, mtime=0)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    return len(data)


def read_transcript(path: str) -> Transcript:
    """Read a transcript; ``ValueError`` names the file and line of a bad one (or says
    that the file is missing)."""
    if not os.path.isfile(path):
        raise ValueError(f"no transcript {path}; record it with --record")
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a gzip'd transcript ({exc})") from None
    items: list[dict[str, Any]] = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        number = len(items) + 1
        try:
            item = json.loads(data[pos:end])
        except ValueError as exc:
            raise ValueError(f"{path}: line {number}: not JSON ({exc})") from None
        if not isinstance(item, dict):
            raise ValueError(f"{path}: line {number}: expected an object")
        pos = end + 1
        if items:  # a seed line: its blob follows
            if not isinstance(item.get("seed"), int) or not isinstance(item.get("ops"), list):
                raise ValueError(f"{path}: line {number}: a seed line needs 'seed' and 'ops'")
            size = item.get("blob")
            if not isinstance(size, int) or not 0 <= size <= len(data) - pos:
                raise ValueError(f"{path}: line {number}: 'blob' is not the blob's length")
            item["blob"], pos = data[pos : pos + size], pos + size
        elif item.get("format") != FORMAT:
            raise ValueError(f"{path}: line 1: header 'format' is not {FORMAT}")
        items.append(item)
    if not items:
        raise ValueError(f"{path}: empty transcript")
    return Transcript(header=items[0], seeds=items[1:])


def replay_seed(
    layout: Layout, transcript: Transcript, record: dict[str, Any], b: Side,
    ignore: frozenset[str] = frozenset(),
) -> Any:
    """Run one recorded seed against ``b``; the workload's options come from the header."""
    head = transcript.header
    return run_seed(
        layout,
        record["seed"],
        len(record["ops"]),
        ReplaySide(record),
        b,
        extras=frozenset(head["extras"]),
        ignore=ignore,
        bursts=bool(head["bursts"]),
    )
