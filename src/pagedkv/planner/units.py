"""Memory sizes in text: ``80GB`` (decimal), ``80GiB`` or ``80G`` (binary), ``81920MiB``,
plain bytes.

>>> parse_bytes("80GB"), parse_bytes("1.5GiB"), parse_bytes("80G"), parse_bytes("4096")
(80000000000, 1610612736, 85899345920, 4096)
>>> format_bytes(1610612736)
'1.50 GiB'
"""

from __future__ import annotations

import re

from pagedkv.errors import InvalidArgumentError

__all__ = ["format_bytes", "parse_bytes"]

_UNIT_TO_BYTES = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
}
_SIZE = re.compile(r"\s*([+-]?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_bytes(text: str, *, what: str = "memory size") -> int:
    """Bytes in ``text``: a number with an optional unit (B, KB/MB/GB/TB = powers of 1000,
    KiB/MiB/GiB/TiB and the one-letter K/M/G/T = powers of 1024, as ``free -g`` and
    Docker read them; case-insensitive). Fractions round down to a byte.

    Raises:
        InvalidArgumentError: not a size, an unknown unit, or a negative size (``what``
            names the quantity in the message).
    """
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNIT_TO_BYTES:
        raise InvalidArgumentError(
            f"{what} {text!r} is not a size; write e.g. 80GiB, 80G, 80GB, 81920MiB or 4096 "
            "(bytes)"
        )
    value = float(match.group(1)) * _UNIT_TO_BYTES[unit]
    if value < 0:
        raise InvalidArgumentError(f"{what} must not be negative, got {text!r}")
    if not value < 2**63:  # also NaN and infinity (1e999)
        raise InvalidArgumentError(f"{what} {text!r} is beyond 2**63 - 1 bytes")
    return int(value)


def format_bytes(num_bytes: int) -> str:
    """``num_bytes`` in the largest binary unit that keeps it at least 1 (two decimals)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.2f} {unit}"
    return f"{num_bytes} B"
