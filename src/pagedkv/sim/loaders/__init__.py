"""Trace loaders: one module per format, registered in :mod:`.registry`, and
:func:`load_trace`, which reads one file, a directory of files or a glob.

Built-in formats: ``mooncake`` (JSON lines with ``hash_ids``), ``azure`` (length-only CSV),
``kv-cache-tester`` (one JSON document per agentic session, sub-agents nested). ``auto``
detects the format from the content, then from the file name, and says what it expected
when neither fits.

Several files (a directory or a glob) replay as concurrent sessions: file ``k`` (in name
order) starts ``k * session_stagger_s`` seconds after the first, and files whose ids are
local (kv-cache-tester's ``hash_id_scope: "local"``) get their ids renamed apart so two
sessions never share a block by accident of numbering.
"""

from __future__ import annotations

import glob
from dataclasses import replace
from pathlib import Path

from pagedkv.errors import InputFileError, InvalidArgumentError
from pagedkv.sim.loaders import azure, kv_cache_tester, mooncake
from pagedkv.sim.loaders.common import read_head
from pagedkv.sim.loaders.registry import (
    LoadOptions,
    TraceFormat,
    formats,
    get_format,
    register_format,
)
from pagedkv.sim.workloads import MOONCAKE_BLOCK_SIZE, SimRequest, Workload

__all__ = [
    "LoadOptions",
    "TraceFormat",
    "detect_format",
    "formats",
    "load_trace",
    "register_format",
    "trace_files",
]

_BUILTIN = (mooncake, azure, kv_cache_tester)  # imported for their registrations


def detect_format(path: Path) -> TraceFormat:
    """The format of ``path``: the first registered format whose sniffer accepts the
    start of the file, else the one its extension names.

    Raises:
        InputFileError: an empty, binary or unrecognisable file (the message lists what
            each format expects).
    """
    head = read_head(path)
    if not head.strip():
        raise InputFileError(str(path), "the file is empty; a trace needs at least one request")
    for fmt in formats().values():
        if fmt.sniff(head):
            return fmt
    name = path.name.lower().removesuffix(".gz")
    for fmt in formats().values():
        if name.endswith(fmt.extensions):
            return fmt
    expected = "; ".join(f"{f.name}: {f.expects}" for f in formats().values())
    raise InputFileError(
        str(path), f"cannot tell the trace format (starts {head.lstrip()[:40]!r}); expected "
        f"one of — {expected}; or name it with --trace-format",
    )


def trace_files(spec: str | Path) -> list[Path]:
    """The files ``spec`` names: itself, the files of a directory (name order, hidden
    files and LICENSE/README/*.md left out), or the matches of a glob.

    Raises:
        InputFileError: nothing there.
    """
    p = Path(spec)
    if p.is_dir():
        files = sorted(
            f for f in p.iterdir()
            if f.is_file() and not f.name.startswith(".")
            and f.name.split(".")[0].upper() not in ("LICENSE", "README", "SOURCE")
            and f.suffix.lower() not in (".md", ".txt")
        )
        if not files:
            raise InputFileError(str(p), "the directory holds no trace file")
        return files
    text = str(spec)
    if any(c in text for c in "*?[") and not p.exists():
        files = sorted(Path(m) for m in glob.glob(text) if Path(m).is_file())
        if not files:
            raise InputFileError(text, "the pattern matches no file")
        return files
    return [p]


def load_trace(
    path: str | Path,
    *,
    fmt: str = "auto",
    skip_bad_lines: bool = False,
    limit: int | None = None,
    source_block_size: int = MOONCAKE_BLOCK_SIZE,
    session_stagger_s: float = 0.0,
) -> Workload:
    """Load a trace: one file, a directory of files or a glob (module docstring).

    ``fmt``: a registered format name or "auto". ``limit``: keep the first N requests.
    ``source_block_size``: tokens per hash id for formats that do not say (Mooncake).

    Raises:
        InputFileError: unreadable file or a bad line (unless ``skip_bad_lines``).
        InvalidArgumentError: unknown ``fmt``, a negative stagger, or files with different
            hash block sizes.
    """
    if fmt != "auto":
        get_format(fmt)
    if session_stagger_s < 0:
        raise InvalidArgumentError(f"session stagger must be >= 0 s, got {session_stagger_s}")
    files = trace_files(path)
    opts = LoadOptions(skip_bad_lines=skip_bad_lines, source_block_size=source_block_size,
                       limit=limit if len(files) == 1 else None)
    loaded = []
    for f in files:
        chosen = detect_format(f) if fmt == "auto" else get_format(fmt)
        loaded.append(chosen.load(f, opts))
    if len(loaded) == 1:
        return loaded[0]
    return _merge(str(path), loaded, session_stagger_s).limited(limit)


def _merge(name: str, parts: list[Workload], stagger_s: float) -> Workload:
    sizes = {w.source_block_size for w in parts if w.source_block_size is not None}
    if len(sizes) > 1:
        raise InvalidArgumentError(
            f"{name}: the files use different hash block sizes {sorted(sizes)}; replay them "
            "separately"
        )
    names: dict[tuple[int, int], int] = {}
    reqs: list[SimRequest] = []
    for k, w in enumerate(parts):
        scope = k if w.hash_ids_local else -1
        offset = k * stagger_s
        for r in w.requests:
            ids = r.hash_ids
            if ids is not None:
                ids = tuple(names.setdefault((scope, h), len(names)) for h in ids)
            reqs.append(replace(r, request_id=f"{w.name}:{r.request_id}", hash_ids=ids,
                                arrival_s=r.arrival_s + offset, parent=None))
    reqs.sort(key=lambda r: r.arrival_s)
    skipped = sum(w.num_skipped_lines for w in parts)
    first = next((w.first_skipped_problem for w in parts if w.first_skipped_problem), None)
    return Workload(
        name=Path(name).name or name,
        requests=tuple(reqs),
        source_block_size=sizes.pop() if sizes else None,
        num_skipped_lines=skipped,
        first_skipped_problem=first,
        description=f"{len(parts)} sessions from {name} (stagger {stagger_s:g} s): "
        f"{len(reqs)} requests",
    )
