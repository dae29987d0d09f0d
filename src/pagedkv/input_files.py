"""The one way pagedkv reads a file: :func:`read_text` (a whole small file),
:func:`open_binary` (a stream, e.g. a trace, gzip or not) and :func:`load_document`
(a JSON, YAML or TOML file parsed by :mod:`pagedkv.json_input`).

Every reader refuses, as :class:`~pagedkv.errors.InputFileError` naming the file:
anything but a regular file (a directory, ``/dev/zero``, a FIFO, a socket, also behind a
link: such files never end or block forever), a file over its size cap, and text that is
not UTF-8 (naming the line and byte). ``tests/architecture`` fails if any other module
opens a file for reading.

>>> load_document("/dev/zero", what="grid")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pagedkv.errors.InputFileError: /dev/zero: a character device, not a regular file; ...
"""

from __future__ import annotations

import gzip
import os
import stat
from pathlib import Path
from typing import IO, Any

from pagedkv.errors import InputFileError
from pagedkv.json_input import parse_json, parse_toml, parse_yaml

__all__ = ["MAX_DOCUMENT_BYTES", "load_document", "open_binary", "read_text",
           "regular_file"]

#: The largest configuration-like file (grid, config, prices, spec, calibration) read.
MAX_DOCUMENT_BYTES = 64 * 2**20

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"))


def regular_file(path: str | Path, *, what: str = "file") -> int:
    """The size in bytes of ``path``, a regular file (links followed).

    Raises:
        InputFileError: missing, unreadable, or not a regular file.
    """
    name = str(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputFileError(name, f"cannot open the {what} ({exc.strerror or exc})") from None
    except ValueError as exc:  # an embedded NUL or an unencodable name
        raise InputFileError(repr(name), f"not a usable file name ({exc})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a file")
        raise InputFileError(name, f"{kind}, not a regular file; give the {what} as a file")
    return st.st_size


def open_binary(path: str | Path, *, what: str = "file", gunzip: bool = False) -> IO[bytes]:
    """``path`` opened for reading bytes (decompressed as gzip with ``gunzip``), once
    :func:`regular_file` accepts it; the caller closes it.

    Raises:
        InputFileError: as :func:`regular_file`, or it cannot be opened.
    """
    regular_file(path, what=what)
    try:
        if gunzip:
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return open(path, "rb")
    except OSError as exc:
        raise InputFileError(str(path), f"cannot open the {what} ({exc.strerror or exc})") \
            from None


def read_text(path: str | Path, *, what: str = "file",
              max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """The whole of ``path`` as UTF-8 text, at most ``max_bytes`` long.

    Raises:
        InputFileError: as :func:`open_binary`; larger than ``max_bytes`` (named); a NUL
            byte (binary data); not UTF-8 (naming the line and byte).
    """
    name = str(path)
    with open_binary(path, what=what) as fh:
        try:
            raw = fh.read(max_bytes + 1)
        except OSError as exc:
            raise InputFileError(name, f"cannot read the {what} ({exc.strerror or exc})") \
                from None
    if len(raw) > max_bytes:
        raise InputFileError(name, f"larger than the {max_bytes:,}-byte limit for a {what}")
    return decode_utf8(raw, name)


def decode_utf8(raw: bytes, name: str) -> str:
    """``raw`` decoded as UTF-8 (a leading BOM dropped).

    Raises:
        InputFileError: a NUL byte, or bytes that are not UTF-8, naming line and byte.
    """
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise InputFileError(name, f"a binary file, not text (a NUL byte at byte {nul})",
                             line=raw.count(b"\n", 0, nul) + 1)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputFileError(name, f"not UTF-8 text (byte {exc.start}: {exc.reason}); "
                             "save it as UTF-8", line=line) from None


_PARSERS = {".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}


def load_document(path: str | Path, *, what: str = "file", fmt: str | None = None,
                  max_bytes: int = MAX_DOCUMENT_BYTES, hint: str = "") -> Any:
    """The document in ``path``, parsed as ``fmt`` (``"json"``, ``"yaml"``, ``"toml"``;
    by default from the suffix, JSON when unknown).

    Raises:
        InputFileError: as :func:`read_text` and :mod:`pagedkv.json_input`.
        MissingDependencyError: YAML without PyYAML, TOML on 3.10 without tomli.
    """
    kind = fmt or _PARSERS.get(Path(path).suffix.lower(), "json")
    text = read_text(path, what=what, max_bytes=max_bytes)
    if kind == "yaml":
        return parse_yaml(text, str(path))
    if kind == "toml":
        return parse_toml(text, str(path))
    return parse_json(text, str(path), hint=hint)
