"""The option types of every command that takes a memory size or a GPU: one size parser
(:func:`size_arg`, for ``--gpu-memory``, ``--kv-cache-memory``, ``--host-memory``, ...)
and one GPU vocabulary (:func:`gpu_arg`, the table of :mod:`pagedkv.planner.gpus`).
A value they refuse is a usage error (exit 2) saying why.

>>> size_arg("--gpu-memory")("80")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: 80 is 80 bytes: did you mean 80GiB? Give a unit (GiB, GB, G, MiB, TiB)
>>> gpu_arg("--gpu")("hopper"), gpu_arg("--gpu")("b200")
('H100-SXM', 'B200')
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from pagedkv.errors import InvalidArgumentError
from pagedkv.planner.gpus import find_gpu
from pagedkv.planner.units import parse_bytes

__all__ = ["SMALLEST_BARE_SIZE", "check_size", "gpu_arg", "size_arg"]

#: A bare number below this many bytes given as a memory size is a forgotten unit.
SMALLEST_BARE_SIZE = 1 << 20


def check_size(text: str) -> int:
    """Bytes in the memory size ``text`` (:func:`pagedkv.planner.units.parse_bytes`),
    refusing a bare number under :data:`SMALLEST_BARE_SIZE` as a forgotten unit.

    Raises:
        InvalidArgumentError: not a size, negative ("must not be negative"), beyond 64
            bits, or a bare small number ("did you mean 80GiB?").
    """
    text = text.strip()
    value = parse_bytes(text, what="the size")
    if text.isdigit() and 0 < value < SMALLEST_BARE_SIZE:
        raise InvalidArgumentError(
            f"{text} is {value} bytes: did you mean {text}GiB? Give a unit (GiB, GB, G, "
            "MiB, TiB)")
    return value


def size_arg(flag: str) -> Callable[[str], str]:
    """An argparse ``type`` for a memory size: the text (stripped) when
    :func:`check_size` takes it, else a usage error (exit 2) saying why."""

    def parse(text: str) -> str:
        try:
            check_size(text)
        except InvalidArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text.strip()

    parse.__name__ = f"{flag} size"
    setattr(parse, "returns_text", True)  # noqa: B010
    return parse


def gpu_arg(flag: str) -> Callable[[str], str]:
    """An argparse ``type`` for a GPU: a name of the one table
    (:func:`pagedkv.planner.gpus.find_gpu`, any case, families and aliases too),
    returned as the table's name; a ``.json`` spec path is returned as given (read by
    the run). An unknown name is a usage error naming the close matches."""

    def parse(text: str) -> str:
        if text.lower().endswith(".json") or "/" in text:
            return text
        try:
            return find_gpu(text).name
        except InvalidArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = f"{flag} GPU"
    setattr(parse, "returns_text", True)  # noqa: B010
    return parse

