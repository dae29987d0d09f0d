"""Mooncake-style JSON-lines traces (the FAST'25 release; also NVIDIA aiperf/Dynamo files
in the same shape): one object per line with ``timestamp`` (ms), ``input_length``,
``output_length`` and ``hash_ids`` (one per ``source_block_size`` prompt tokens, the last
one possibly covering a partial block: ``ceil(input_length / source_block_size)`` ids).

Blank lines are ignored; requests are sorted by timestamp (stable) and shifted to start at 0.
"""

from __future__ import annotations

import math
from pathlib import Path

from pagedkv.errors import InputFileError
from pagedkv.json_input import parse_json
from pagedkv.sim.loaders.common import Skips, int_field, open_text, shift_requests
from pagedkv.sim.loaders.registry import TraceFormat, register_format
from pagedkv.sim.workloads import MOONCAKE_BLOCK_SIZE, SimRequest, Workload

__all__ = ["load_mooncake_jsonl"]

_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def load_mooncake_jsonl(
    path: str | Path,
    *,
    skip_bad_lines: bool = False,
    limit: int | None = None,
    source_block_size: int = MOONCAKE_BLOCK_SIZE,
) -> Workload:
    """Load a Mooncake-style JSONL trace (module docstring).

    Raises:
        InputFileError: a bad line (invalid JSON, missing key, wrong type or value, wrong
            number of ``hash_ids``) unless ``skip_bad_lines``; names file, line and key.
    """
    p = Path(path)
    name = str(p)
    skips = Skips(skip_bad_lines)
    reqs: list[SimRequest] = []
    with open_text(p) as f:
        try:
            for lineno, text in enumerate(f, 1):
                if limit is not None and len(reqs) >= limit:
                    break
                if not text.strip():
                    continue
                try:
                    reqs.append(_line(name, lineno, text, len(reqs), source_block_size))
                except InputFileError as exc:
                    skips.bad(exc)
        except UnicodeDecodeError as exc:
            raise InputFileError(name, f"not UTF-8 text ({exc.reason})") from None
    if not reqs:
        raise InputFileError(name, "no valid request in the file")
    reqs = shift_requests(reqs)
    return Workload(
        name=p.name,
        requests=tuple(reqs),
        source_block_size=source_block_size,
        num_skipped_lines=skips.count,
        first_skipped_problem=skips.first,
        description=f"Mooncake-style trace {p.name}: {len(reqs)} requests",
    )


def _line(path: str, line: int, text: str, n: int, source_bs: int) -> SimRequest:
    hint = ""
    if line == 1 and text.lstrip().startswith("{") and not text.rstrip().endswith("}"):
        hint = " (a JSON document spread over lines is not JSON lines: is it a " \
               "kv-cache-tester session? try --trace-format kv-cache-tester)"
    obj = parse_json(text, path, line=line, hint=hint)
    if not isinstance(obj, dict):
        raise InputFileError(path, "a line must be a JSON object", line=line)
    for key in _KEYS:
        if key not in obj:
            raise InputFileError(path, "missing", line=line, key=key)
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise InputFileError(
            path, f"must be a number of milliseconds, got {ts!r}", line=line, key="timestamp"
        )
    if ts < 0:
        raise InputFileError(path, f"must be >= 0, got {ts}", line=line, key="timestamp")
    num_in = int_field(path, line, "input_length", obj["input_length"], minimum=1)
    num_out = int_field(path, line, "output_length", obj["output_length"], minimum=0)
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


def _sniff(head: str) -> bool:
    first = head.lstrip().split("\n", 1)[0]
    return first.startswith("{") and first.rstrip().endswith("}") and '"timestamp"' in first


register_format(TraceFormat(
    name="mooncake",
    expects="JSON lines, one object per line with timestamp (ms), input_length, "
            "output_length, hash_ids",
    extensions=(".jsonl", ".ndjson"),
    sniff=_sniff,
    load=lambda path, o: load_mooncake_jsonl(
        path, skip_bad_lines=o.skip_bad_lines, limit=o.limit,
        source_block_size=o.source_block_size,
    ),
))
