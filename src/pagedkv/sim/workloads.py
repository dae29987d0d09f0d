"""Workloads: what the simulator replays, and the loaders for trace files.

A :class:`Workload` is a tuple of :class:`SimRequest` in arrival order. A request's prompt
content is given in one of three ways, which decide its block hashes at a block size ``b``
(:func:`request_block_hashes`):

* ``hash_ids`` (Mooncake-style traces): one id per ``source_block_size``-token block of the
  prompt (the last one possibly partial), with prefix semantics — equal ids at a position
  mean equal prompts up to the end of that block. Block ``i``'s chain digest is
  ``D_i = sha256(D_{i-1} || id_i as 8 little-endian bytes)`` (``D_-1`` a fixed root), so the
  derived hashes keep prefix semantics even if a trace reused an id under another prefix.

  - ``b == source_block_size``: block ``i`` hashes to ``D_i``;
  - ``b`` divides it (``k = source / b`` sub-blocks per source block): sub-block ``j`` of
    block ``i`` hashes to ``D_i || j`` (2 bytes). It depends on every earlier block and on
    ``j``. It also depends on the *whole* of block ``i`` (the trace says nothing finer), so
    two prompts that share only part of a source block never share its sub-blocks: derived
    hashes can under-count sharing inside a source block, never over-count it.
  - ``b`` a multiple of it (``m = b / source``): block ``i`` hashes to ``D_{(i+1)m-1}``.

  Only *full* blocks of the prompt get a hash (``num_prompt_tokens // b`` of them).
  Worked case, source 512, ``b`` = 256, 1200 prompt tokens, ``hash_ids = [7, 9, 4]``:
  4 full blocks -> ``[D_0||0, D_0||1, D_1||0, D_1||1]``; tokens 1024..1199 (block of id 4
  and the rest) stay unhashed, so the manager hashes them from their token ids later.
* ``prompt_token_ids`` (generators): real token ids; the manager hashes them itself.
* neither (length-only traces such as Azure's): no sharing at all; every block gets a hash
  unique to the request.

Tokens past the supplied hashes (the unhashed prompt tail and the decode tokens) are
placeholders: prompt tails are 0s and decode tokens are ``decode_token_id`` (unique per
request), so decode blocks never collide across requests. Generators give real output
tokens instead (a multi-turn reply reappears in the next turn's prompt).

Bad lines raise :class:`pagedkv.InputFileError` naming file, line and key; with
``skip_bad_lines`` they are skipped and counted in ``Workload.num_skipped_lines`` (the
first problem is kept in ``Workload.first_skipped_problem``).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path

from pagedkv.errors import InputFileError, InvalidArgumentError

__all__ = [
    "MOONCAKE_BLOCK_SIZE",
    "SimRequest",
    "Workload",
    "bundled_trace_path",
    "load_azure_csv",
    "load_mooncake_jsonl",
    "load_trace",
    "request_block_hashes",
]

#: Tokens per ``hash_ids`` entry in the Mooncake traces.
MOONCAKE_BLOCK_SIZE = 512
_ROOT = hashlib.sha256(b"pagedkv-sim-trace-root").digest()
_SUFFIX = [j.to_bytes(2, "big") for j in range(1 << 16)]
_BUNDLED = "conversation_trace_head.jsonl"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimRequest:
    """One request of a workload.

    ``arrival_s``: arrival time in seconds from the workload start. For a request with a
    ``parent`` (index of an earlier request in the same workload) it is only a nominal
    time used for ordering in pure-cache mode: the engine lets it arrive ``think_s``
    seconds after the parent finished (a closed loop: the next turn of a chat).
    ``num_output_tokens``: tokens to generate (at least one is always generated).
    """

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    hash_ids: tuple[int, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    output_token_ids: tuple[int, ...] | None = None
    parent: int | None = None
    think_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Requests in arrival order plus what is known about them.

    ``source_block_size``: tokens per ``hash_ids`` entry (None when no request has any).
    ``ideal_hit_rate``: the analytic infinite-cache, block-granular hit rate (generators;
    keyed by block size via :attr:`ideal_hit_rate_fn`), None for traces.
    """

    name: str
    requests: tuple[SimRequest, ...]
    source_block_size: int | None = None
    num_skipped_lines: int = 0
    first_skipped_problem: str | None = None
    description: str = ""
    ideal_hit_rate_fn: Callable[[int, str], float] | None = None

    def ideal_hit_rate(self, block_size: int, mode: str) -> float | None:
        """The analytic ideal hit rate at ``block_size`` in ``mode`` ("engine" or
        "pure-cache"), or None when the workload has none (traces)."""
        fn = self.ideal_hit_rate_fn
        return None if fn is None else fn(block_size, mode)

    def limited(self, limit: int | None) -> Workload:
        """The first ``limit`` requests (all when None); the analytic ideal no longer
        applies to a cut workload and is dropped."""
        if limit is None or limit >= len(self.requests):
            return self
        if limit < 0:
            raise InvalidArgumentError(f"limit must be >= 0, got {limit}")
        return Workload(
            name=self.name,
            requests=self.requests[:limit],
            source_block_size=self.source_block_size,
            num_skipped_lines=self.num_skipped_lines,
            first_skipped_problem=self.first_skipped_problem,
            description=f"{self.description} (first {limit} requests)",
            ideal_hit_rate_fn=None,
        )


# ---------------------------------------------------------------- block hashes


def check_block_size(block_size: int, source_block_size: int | None) -> None:
    """Raise :class:`InvalidArgumentError` unless ``block_size`` divides, equals or is a
    multiple of ``source_block_size`` (any block size goes when there is no source)."""
    if not isinstance(block_size, int) or block_size <= 0:
        raise InvalidArgumentError(f"block size must be a positive int, got {block_size!r}")
    if source_block_size is None:
        return
    if source_block_size % block_size and block_size % source_block_size:
        raise InvalidArgumentError(
            f"block size {block_size} cannot replay a trace of {source_block_size}-token "
            f"hash blocks: use a divisor of {source_block_size} (e.g. 16, 64, 256) or a "
            "multiple of it"
        )


def request_block_hashes(
    request: SimRequest, block_size: int, *, source_block_size: int | None, index: int = 0
) -> list[bytes] | None:
    """The block hashes of ``request``'s full prompt blocks at ``block_size`` (module
    docstring), or None when the manager should hash its token ids itself.

    ``index`` (the request's position in its workload) keys the unique hashes of
    length-only requests. Pure; O(prompt blocks).
    """
    num_full = request.num_prompt_tokens // block_size
    ids = request.hash_ids
    if ids is None:
        if request.prompt_token_ids is not None:
            return None
        key = b"u" + index.to_bytes(8, "little")
        return [key + i.to_bytes(4, "little") for i in range(num_full)]
    assert source_block_size is not None
    sha = hashlib.sha256
    out: list[bytes] = []
    parent = _ROOT
    if block_size >= source_block_size:
        m = block_size // source_block_size
        for i, hid in enumerate(ids[: num_full * m]):
            parent = sha(parent + hid.to_bytes(8, "little")).digest()
            if (i + 1) % m == 0:
                out.append(parent)
        return out
    k = source_block_size // block_size
    suffix = _SUFFIX[:k]
    for hid in ids[: -(-num_full // k)]:
        parent = sha(parent + hid.to_bytes(8, "little")).digest()
        out.extend([parent + s for s in suffix])
    del out[num_full:]
    return out


# ---------------------------------------------------------------- loaders


def bundled_trace_path() -> Path:
    """Path of the bundled default trace (head of Mooncake's conversation trace)."""
    return Path(str(resources.files("pagedkv") / "data" / "traces" / _BUNDLED))


def _open_text(path: Path) -> io.TextIOBase:
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise InputFileError(str(path), f"cannot open: {exc.strerror or exc}") from None


def _detect_format(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "mooncake"
    if name.endswith(".csv"):
        return "azure"
    with _open_text(path) as f:
        for line in f:
            if line.strip():
                return "mooncake" if line.lstrip().startswith("{") else "azure"
    raise InputFileError(str(path), "the file is empty; a trace needs at least one request")


def load_trace(
    path: str | Path,
    *,
    fmt: str = "auto",
    skip_bad_lines: bool = False,
    limit: int | None = None,
    source_block_size: int = MOONCAKE_BLOCK_SIZE,
) -> Workload:
    """Load a trace file: ``fmt`` "mooncake" (JSONL), "azure" (CSV) or "auto" (by the
    file name, else by the first line). ``limit``: keep the first N requests.

    Raises:
        InputFileError: unreadable file or a bad line (unless ``skip_bad_lines``).
        InvalidArgumentError: unknown ``fmt``.
    """
    p = Path(path)
    if fmt == "auto":
        fmt = _detect_format(p)
    if fmt == "mooncake":
        return load_mooncake_jsonl(
            p, skip_bad_lines=skip_bad_lines, limit=limit, source_block_size=source_block_size
        )
    if fmt == "azure":
        return load_azure_csv(p, skip_bad_lines=skip_bad_lines, limit=limit)
    raise InvalidArgumentError(f"unknown trace format {fmt!r}; choose auto, mooncake or azure")


class _Skips:
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


def _int_field(
    path: str, line: int, key: str, value: object, *, minimum: int
) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InputFileError(path, f"must be an integer, got {value!r}", line=line, key=key)
    if value < minimum:
        raise InputFileError(path, f"must be >= {minimum}, got {value}", line=line, key=key)
    return value


def load_mooncake_jsonl(
    path: str | Path,
    *,
    skip_bad_lines: bool = False,
    limit: int | None = None,
    source_block_size: int = MOONCAKE_BLOCK_SIZE,
) -> Workload:
    """Load a Mooncake-style JSONL trace: one object per line with ``timestamp`` (ms),
    ``input_length``, ``output_length`` and ``hash_ids`` (one per ``source_block_size``
    prompt tokens, ``ceil(input_length / source_block_size)`` of them). Blank lines are
    ignored; requests are sorted by timestamp (stable).

    Raises:
        InputFileError: a bad line (invalid JSON, missing key, wrong type or value, wrong
            number of ``hash_ids``) unless ``skip_bad_lines``; names file, line and key.
    """
    p = Path(path)
    name = str(p)
    skips = _Skips(skip_bad_lines)
    reqs: list[SimRequest] = []
    t0: float | None = None
    with _open_text(p) as f:
        for lineno, text in enumerate(f, 1):
            if limit is not None and len(reqs) >= limit:
                break
            if not text.strip():
                continue
            try:
                reqs.append(_mooncake_line(name, lineno, text, len(reqs), source_block_size))
            except InputFileError as exc:
                skips.bad(exc)
    if reqs:
        t0 = min(r.arrival_s for r in reqs)
    if not reqs:
        raise InputFileError(name, "no valid request in the file")
    if t0:
        reqs = [_shift(r, t0) for r in reqs]
    reqs.sort(key=lambda r: r.arrival_s)
    return Workload(
        name=p.name,
        requests=tuple(reqs),
        source_block_size=source_block_size,
        num_skipped_lines=skips.count,
        first_skipped_problem=skips.first,
        description=f"Mooncake-style trace {p.name}: {len(reqs)} requests",
    )


def _shift(r: SimRequest, t0: float) -> SimRequest:
    return SimRequest(
        request_id=r.request_id,
        arrival_s=r.arrival_s - t0,
        num_prompt_tokens=r.num_prompt_tokens,
        num_output_tokens=r.num_output_tokens,
        hash_ids=r.hash_ids,
    )


def _mooncake_line(path: str, line: int, text: str, n: int, source_bs: int) -> SimRequest:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"not valid JSON ({exc.msg})", line=line) from None
    if not isinstance(obj, dict):
        raise InputFileError(path, "a line must be a JSON object", line=line)
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise InputFileError(path, "missing", line=line, key=key)
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise InputFileError(
            path, f"must be a number of milliseconds, got {ts!r}", line=line, key="timestamp"
        )
    if ts < 0:
        raise InputFileError(path, f"must be >= 0, got {ts}", line=line, key="timestamp")
    num_in = _int_field(path, line, "input_length", obj["input_length"], minimum=1)
    num_out = _int_field(path, line, "output_length", obj["output_length"], minimum=0)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 1 << 64 for h in ids
    ):
        raise InputFileError(
            path, "must be a list of non-negative integers", line=line, key="hash_ids"
        )
    want = -(-num_in // source_bs)
    if len(ids) != want:
        raise InputFileError(
            path,
            f"has {len(ids)} ids but input_length {num_in} needs ceil({num_in}/{source_bs}) "
            f"= {want}",
            line=line,
            key="hash_ids",
        )
    return SimRequest(
        request_id=f"r{n}",
        arrival_s=float(ts) / 1000.0,
        num_prompt_tokens=num_in,
        num_output_tokens=num_out,
        hash_ids=tuple(ids),
    )


_AZURE_KEYS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _parse_timestamp(text: str) -> float:
    """Seconds since the epoch (naive, UTC assumed) of ``YYYY-MM-DD HH:MM:SS[.fffffff]``."""
    main, _, frac = text.strip().partition(".")
    dt = datetime.strptime(main, "%Y-%m-%d %H:%M:%S")
    if frac and not frac.isdigit():
        raise ValueError(frac)
    return (dt - datetime(1970, 1, 1)).total_seconds() + (float("0." + frac) if frac else 0.0)


def load_azure_csv(
    path: str | Path, *, skip_bad_lines: bool = False, limit: int | None = None
) -> Workload:
    """Load an Azure LLM-inference CSV trace (``TIMESTAMP, ContextTokens,
    GeneratedTokens``): lengths only, so requests share nothing.

    Raises:
        InputFileError: a missing column in the header, or a bad row (unless
            ``skip_bad_lines``); names file, line and column.
    """
    p = Path(path)
    name = str(p)
    skips = _Skips(skip_bad_lines)
    rows: list[tuple[float, int, int]] = []
    with _open_text(p) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise InputFileError(name, "the file is empty", line=1)
        header = [h.strip() for h in header]
        for key in _AZURE_KEYS:
            if key not in header:
                raise InputFileError(name, f"header lacks the column (has {header})", line=1,
                                     key=key)
        col = [header.index(k) for k in _AZURE_KEYS]
        for row in reader:
            if limit is not None and len(rows) >= limit:
                break
            lineno = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            try:
                rows.append(_azure_row(name, lineno, row, col))
            except InputFileError as exc:
                skips.bad(exc)
    if not rows:
        raise InputFileError(name, "no valid request in the file")
    t0 = min(r[0] for r in rows)
    rows.sort(key=lambda r: r[0])
    reqs = tuple(
        SimRequest(
            request_id=f"r{i}", arrival_s=ts - t0, num_prompt_tokens=ni, num_output_tokens=no
        )
        for i, (ts, ni, no) in enumerate(rows)
    )
    return Workload(
        name=p.name,
        requests=reqs,
        num_skipped_lines=skips.count,
        first_skipped_problem=skips.first,
        description=f"length-only CSV trace {p.name}: {len(reqs)} requests, no sharing",
    )


def _azure_row(path: str, line: int, row: Sequence[str], col: Sequence[int]) -> tuple[
    float, int, int
]:
    if len(row) <= max(col):
        raise InputFileError(path, f"has {len(row)} columns, expected {max(col) + 1}", line=line)
    try:
        ts = _parse_timestamp(row[col[0]])
    except ValueError:
        raise InputFileError(
            path, f"not a 'YYYY-MM-DD HH:MM:SS[.f]' time: {row[col[0]]!r}", line=line,
            key="TIMESTAMP",
        ) from None
    out: list[int] = []
    for key, c, minimum in (("ContextTokens", col[1], 1), ("GeneratedTokens", col[2], 0)):
        try:
            value = int(row[c])
        except ValueError:
            raise InputFileError(
                path, f"must be an integer, got {row[c]!r}", line=line, key=key
            ) from None
        if value < minimum:
            raise InputFileError(path, f"must be >= {minimum}, got {value}", line=line, key=key)
        out.append(value)
    return ts, out[0], out[1]
