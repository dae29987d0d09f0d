"""Azure LLM-inference CSV traces (``TIMESTAMP, ContextTokens, GeneratedTokens``): lengths
only, so requests share nothing (every block gets a hash unique to its request)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from pagedkv.errors import InputFileError
from pagedkv.sim.loaders.common import Skips, open_text
from pagedkv.sim.loaders.registry import TraceFormat, register_format
from pagedkv.sim.workloads import SimRequest, Workload

__all__ = ["load_azure_csv"]

_KEYS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


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
    """Load an Azure LLM-inference CSV trace (module docstring).

    Raises:
        InputFileError: a missing column in the header, or a bad row (unless
            ``skip_bad_lines``); names file, line and column.
    """
    p = Path(path)
    name = str(p)
    skips = Skips(skip_bad_lines)
    rows: list[tuple[float, int, int]] = []
    with open_text(p) as f:
        try:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise InputFileError(name, "the file is empty", line=1)
            header = [h.strip() for h in header]
            for key in _KEYS:
                if key not in header:
                    raise InputFileError(
                        name, f"header lacks the column (has {header}); expected a CSV "
                        f"with columns {', '.join(_KEYS)}", line=1, key=key)
            col = [header.index(k) for k in _KEYS]
            for row in reader:
                if limit is not None and len(rows) >= limit:
                    break
                lineno = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                try:
                    rows.append(_row(name, lineno, row, col))
                except InputFileError as exc:
                    skips.bad(exc)
        except (UnicodeDecodeError, csv.Error) as exc:
            raise InputFileError(name, f"not a readable CSV text file ({exc})") from None
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


def _row(path: str, line: int, row: Sequence[str], col: Sequence[int]) -> tuple[
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


def _sniff(head: str) -> bool:
    first = head.lstrip().split("\n", 1)[0]
    return "ContextTokens" in first and "TIMESTAMP" in first


register_format(TraceFormat(
    name="azure",
    expects="CSV with a header naming TIMESTAMP, ContextTokens, GeneratedTokens",
    extensions=(".csv",),
    sniff=_sniff,
    load=lambda path, o: load_azure_csv(path, skip_bad_lines=o.skip_bad_lines, limit=o.limit),
))
