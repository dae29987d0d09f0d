"""The trace-format registry: each format is one module that registers a
:class:`TraceFormat` (a name, what it expects, how to recognise and load a file).

Adding a format (Bailian/Qwen traces, ShareGPT conversations, ...) is one module in this
package that calls :func:`register_format` at import and is listed in
``pagedkv.sim.loaders._BUILTIN``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pagedkv.arg_types import check_fields
from pagedkv.errors import InvalidArgumentError
from pagedkv.sim.workloads import MOONCAKE_BLOCK_SIZE, Workload

__all__ = ["LoadOptions", "TraceFormat", "formats", "get_format", "register_format"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadOptions:
    """What a loader may be asked for. ``source_block_size``: tokens per hash id for
    formats that do not say (Mooncake JSONL); ``limit``: keep the first N requests of a
    file; ``skip_bad_lines``: count and skip malformed lines instead of failing."""

    skip_bad_lines: bool = False
    limit: int | None = None
    source_block_size: int = MOONCAKE_BLOCK_SIZE

    def __post_init__(self) -> None:
        check_fields(self)  # types, finiteness, 64-bit and duration bounds


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceFormat:
    """One trace format.

    ``expects``: a one-line description used in error messages ("expected ...");
    ``extensions``: file-name endings (before ``.gz``) that select it without sniffing;
    ``sniff(head)``: whether the first few KiB of text look like this format;
    ``load(path, options)``: the workload of one file (its ``hash_ids_local`` says whether
    its ids mean anything outside it).
    """

    name: str
    expects: str
    extensions: tuple[str, ...]
    sniff: Callable[[str], bool]
    load: Callable[[Path, LoadOptions], Workload]


_FORMATS: dict[str, TraceFormat] = {}


def register_format(fmt: TraceFormat) -> None:
    """Register ``fmt`` under its name (a later registration of the same name replaces it)."""
    _FORMATS[fmt.name] = fmt


def formats() -> dict[str, TraceFormat]:
    """The registered formats by name, in registration order."""
    return dict(_FORMATS)


def get_format(name: str) -> TraceFormat:
    """The format called ``name``.

    Raises:
        InvalidArgumentError: no such format (the message lists them).
    """
    try:
        return _FORMATS[name]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown trace format {name!r}; choose auto or one of {', '.join(_FORMATS)}"
        ) from None
