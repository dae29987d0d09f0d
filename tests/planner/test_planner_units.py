"""Memory sizes in text."""

from __future__ import annotations

import pytest

from pagedkv.errors import InvalidArgumentError
from pagedkv.planner import format_bytes, parse_bytes


@pytest.mark.parametrize(("text", "num_bytes"), [
    ("80GB", 80_000_000_000), ("80GiB", 85_899_345_920), ("81920MiB", 85_899_345_920),
    ("4096", 4096), ("1.5 GiB", 1_610_612_736), ("512kib", 524_288), ("7B", 7),
    ("2TB", 2 * 10**12), ("0", 0),
])
def test_parse(text: str, num_bytes: int) -> None:
    assert parse_bytes(text) == num_bytes


@pytest.mark.parametrize(("text", "problem"), [
    ("-5GB", "must not be negative"), ("eighty", "is not a size"), ("80 GX", "is not a size"),
    ("", "is not a size"),
])
def test_parse_errors(text: str, problem: str) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        parse_bytes(text, what="--gpu-memory")


def test_format() -> None:
    assert format_bytes(1_610_612_736) == "1.50 GiB"
    assert format_bytes(65_536) == "64.00 KiB"
    assert format_bytes(512) == "512 B"
