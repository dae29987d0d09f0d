"""Types of the compiled core (``pagedkv/_csrc/ccore.c``); see :mod:`pagedkv.core.native`."""

from typing import Any

def hash_plain(
    hasher: Any, hashes: list[bytes], tokens: list[int], start: int, stop: int,
    block_size: int, memo_blocks: int, /,
) -> bool: ...
def sha256(data: bytes, /) -> bytes: ...
def sha256_mode(portable: bool | None = None, /) -> str: ...
