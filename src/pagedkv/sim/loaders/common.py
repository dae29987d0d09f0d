"""Helpers shared by the trace loaders: opening files (plain or gzip) with errors that name
the file, counting skipped lines, checking integer fields, and shifting arrival times."""

from __future__ import annotations

import gzip
import io
import os
import zlib
from dataclasses import replace
from pathlib import Path

from pagedkv.errors import InputFileError
from pagedkv.input_files import open_binary
from pagedkv.sim.workloads import SimRequest

__all__ = ["Skips", "int_field", "open_text", "read_head", "shift_requests"]

_GZIP_MAGIC = b"\x1f\x8b"


def _check_text(path: Path, head: bytes) -> None:
    if b"\x00" in head:
        raise InputFileError(
            str(path), "a binary file, not a text trace (JSON lines, JSON or CSV; .gz works)"
        )
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the end of the sample
            raise InputFileError(
                str(path), f"not UTF-8 text (byte {exc.start}): a trace must be text"
            ) from None


def read_head(path: Path, size: int = 4096) -> str:
    """The first ``size`` bytes of ``path`` (decompressed when gzip) as text.

    Raises:
        InputFileError: the file cannot be opened, is a directory, is not gzip although
            named ``.gz``, or is binary / not UTF-8.
    """
    raw, _ = _read_raw_head(path, size)
    _check_text(path, raw)
    return raw.decode("utf-8", errors="ignore")


def _read_raw_head(path: Path, size: int) -> tuple[bytes, bool]:
    """(first ``size`` bytes, decompressed when gzip; whether it is gzip)."""
    name = str(path)
    if os.path.isdir(path):
        raise InputFileError(name, "is a directory; give a trace file, or a directory of "
                             "session files")
    with open_binary(path, what="trace") as f:
        try:
            raw = f.read(size)
        except OSError as exc:
            raise InputFileError(name, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == _GZIP_MAGIC:
        try:
            with open_binary(path, what="trace", gunzip=True) as g:
                return g.read(size), True
        except (OSError, EOFError, zlib.error) as exc:
            raise InputFileError(name, f"a corrupt gzip file ({exc})") from None
    if path.suffix == ".gz":
        raise InputFileError(name, "named .gz but not gzip-compressed (no gzip header); "
                             "rename it or compress it")
    return raw, False


def open_text(path: Path) -> io.TextIOBase:
    """Open ``path`` as UTF-8 text, gunzipping it when it starts with the gzip magic.

    Raises:
        InputFileError: as :func:`read_head`.
    """
    raw, is_gzip = _read_raw_head(path, 4096)
    _check_text(path, raw)
    return io.TextIOWrapper(open_binary(path, what="trace", gunzip=is_gzip), encoding="utf-8")


def read_all_text(path: Path) -> str:
    """The whole file as text (``open_text``), decode and gzip errors named.

    Raises:
        InputFileError: as :func:`read_head`, or a bad byte / truncated gzip later on.
    """
    try:
        with open_text(path) as f:
            return str(f.read())
    except UnicodeDecodeError as exc:
        raise InputFileError(str(path), f"not UTF-8 text ({exc.reason})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputFileError(str(path), f"a corrupt gzip file ({exc})") from None


class Skips:
    """Counts skipped lines, or raises the first problem when skipping is off."""

    def __init__(self, skip: bool) -> None:
        self.skip = skip
        self.count = 0
        self.first: str | None = None

    def bad(self, exc: InputFileError) -> None:
        if not self.skip:
            raise exc
        self.count += 1
        if self.first is None:
            self.first = str(exc)


def int_field(path: str, line: int | None, key: str, value: object, *, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (an integral float is accepted).

    Raises:
        InputFileError: naming ``path``, ``line`` and ``key``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InputFileError(path, f"must be an integer, got {value!r}", line=line, key=key)
    if value < minimum:
        raise InputFileError(path, f"must be >= {minimum}, got {value}", line=line, key=key)
    return value


def shift_requests(reqs: list[SimRequest]) -> list[SimRequest]:
    """Requests sorted by arrival (stable) with the first arrival moved to 0."""
    if not reqs:
        return reqs
    t0 = min(r.arrival_s for r in reqs)
    out = reqs if not t0 else [replace(r, arrival_s=r.arrival_s - t0) for r in reqs]
    return sorted(out, key=lambda r: r.arrival_s)
