"""Each point's result, kept on disk under a hash of what it was computed from.

The **key** of a point is the SHA-256 of the canonical JSON of: the workload digest
(:func:`workload_digest`: the bytes of every trace file, or the generator's name), the
point's options (dest -> value, sorted; the trace's path left out: its bytes are in the
digest) and the pagedkv version. Equal inputs give equal keys on any machine; any change
in them gives a new key, so a re-run computes only points it has not seen.

An entry is one JSON file ``DIR/ab/abcdef....json`` written to a temporary name in the
same directory and renamed into place (atomic on POSIX): a killed sweep leaves whole
entries or none. A point that failed is not stored: a re-run tries it again.

>>> point_key("d" * 64, {"tp": 2, "gpu": "H100-SXM"}, version="0.1.0") == point_key(
...     "d" * 64, {"gpu": "H100-SXM", "tp": 2}, version="0.1.0")
True
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pagedkv import __version__
from pagedkv.errors import InputFileError, InvalidArgumentError
from pagedkv.input_files import load_document, open_binary
from pagedkv.sim.loaders import trace_files
from pagedkv.sim.workloads import bundled_trace_path

__all__ = ["ResultCache", "canonical_json", "point_key", "workload_digest"]

_CHUNK_BYTES = 1 << 20


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgumentError(f"{value!r} cannot be part of a point's key")
    return value


def canonical_json(data: Mapping[str, Any]) -> str:
    """``data`` as JSON with sorted keys, no spaces, tuples as lists."""
    return json.dumps({k: _plain(v) for k, v in data.items()}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)


def workload_digest(options: Mapping[str, Any]) -> str:
    """A hex digest of the workload ``options`` name: the bytes of every trace file (in
    load order, each with its name), the bundled trace without one; a generator's name
    (its parameters are options, in the key already).

    Raises:
        InputFileError: no trace file there.
        OSError: a trace file cannot be read.
    """
    h = hashlib.sha256()
    if options.get("generator") is not None:
        h.update(b"generator:" + str(options["generator"]).encode())
        return h.hexdigest()
    trace = options.get("trace")
    files = trace_files(trace) if trace else [bundled_trace_path()]
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open_binary(f, what="trace") as fh:
            while chunk := fh.read(_CHUNK_BYTES):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def point_key(digest: str, options: Mapping[str, Any], *, version: str = __version__) -> str:
    """The cache key of a point (module docstring)."""
    opts = {k: v for k, v in options.items() if k != "trace"}
    text = canonical_json({"workload": digest, "options": canonical_json(opts),
                           "pagedkv": version})
    return hashlib.sha256(text.encode()).hexdigest()


def _is_seconds(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


class ResultCache:
    """Results on disk under ``directory`` (created on first write), one file per key."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored entry for ``key``, or None (absent, or not a whole entry)."""
        try:
            data = load_document(self.path(key), what="sweep cache entry", fmt="json")
        except InputFileError:
            return None
        if (not isinstance(data, dict) or data.get("key") != key
                or not isinstance(data.get("metrics"), dict)
                or not _is_seconds(data.get("wall_s", 0.0))):
            return None  # not a whole entry: the point is run again and the entry rewritten
        return data

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        """Store ``entry`` (JSON-able) under ``key``, atomically."""
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({**entry, "key": key}, sort_keys=True, allow_nan=False)
        fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def count(self) -> int:
        """How many entries the directory holds."""
        if not self.directory.is_dir():
            return 0
        return sum(1 for _ in self.directory.glob("??/*.json"))
