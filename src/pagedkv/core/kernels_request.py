"""A request's hashing kernels: its prompt's token ids checked and copied, and its full
blocks hashed, in one call (:func:`start_request`); the blocks its growth filled hashed
in one call (:func:`extend_request`).

Each is the pure-Python specification of its compiled twin in ``pagedkv.core._ccore``
(``pagedkv/_csrc/ccore_request.h``), with the same signature. The pure kernel set has
neither (``None`` there): :class:`pagedkv.core.request.Request`'s checked path and
:meth:`BlockHasher.extend` are their Python form, as for ``hash_keyed``. Where a compiled
kernel answers a list (or True), it is this module's answer, with the same changes to
``hashes`` and ``keys_out``.

>>> from pagedkv.core.hashing import BlockHasher
>>> hasher, hashes = BlockHasher(2), []
>>> start_request(hashes, (5, 6, 7), 2, hasher.seed, None, None)
[5, 6, 7]
>>> hashes == [hasher.hash_block(hasher.seed, [5, 6])]
True
>>> start_request(hashes, [5, -1], 2, hasher.seed, None, None) is None   # not token ids
True
>>> extend_request(hashes, [5, 6, 7, 8, 9], 2, hasher.seed, None, None)
True
>>> hashes[1] == hasher.hash_block(hashes[0], [7, 8])
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from pagedkv.core.cbor import cbor_head, encode_tokens
from pagedkv.core.hash_extras import HashExtras
from pagedkv.core.kernels_hybrid import DIGEST_BYTES, block_tails

__all__ = ["ExtendRequest", "StartRequest", "extend_request", "start_request"]

#: ``start_request(hashes, tokens, block_size, seed, extras, keys_out) -> list[int] |
#: None``.
StartRequest = Callable[
    [list[bytes], Sequence[int], int, bytes, "HashExtras | None",
     "list[list[Any] | None] | None"],
    "list[int] | None",
]
#: ``extend_request(hashes, tokens, block_size, seed, extras, keys_out) -> bool``.
ExtendRequest = Callable[
    [list[bytes], Sequence[int], int, bytes, "HashExtras | None",
     "list[list[Any] | None] | None"],
    bool,
]

_TOKEN_LIMIT = 1 << 64
_NULL = b"\xf6"  # the CBOR encoding of None: a block without extra keys


def start_request(hashes: list[bytes], tokens: Sequence[int], block_size: int, seed: bytes,
                  extras: HashExtras | None,
                  keys_out: list[list[Any] | None] | None) -> list[int] | None:
    """A new list of the prompt ``tokens``, with the chained hashes of its full blocks of
    ``block_size`` tokens appended to ``hashes`` (the first parent ``seed``; block ``k``'s
    hash input the canonical CBOR ``[parent, tokens, keys]``, keys as
    :meth:`HashExtras.block_keys` gives them) and, when ``extras`` set anything (not
    :attr:`HashExtras.is_empty`), each block's keys appended to ``keys_out`` (a list, or
    ``None``: not recorded). Exactly what :class:`~pagedkv.core.request.Request` computes
    with a :class:`~pagedkv.core.hashing.BlockHasher` of that seed. O(tokens + blocks x
    items).

    Returns ``None``, with nothing changed, when ``tokens`` is not a non-empty list or
    tuple of token ids (``int``, not a subclass, in ``0 .. 2**64 - 1``) or ``seed`` is not
    32 bytes: the caller's checked path then raises or covers. The compiled twin also
    answers ``None`` for ids of ``2**32`` and more and for extras
    ``extra_tails`` does not cover (prompt embeddings, a LoRA path that is not a ``str``,
    text UTF-8 cannot encode).

    Mutates ``hashes`` and ``keys_out`` only.

    Raises:
        TypeError: ``hashes`` not a list, ``keys_out`` neither a list nor ``None``.
        ValueError: ``block_size`` < 1.
    """
    _check_lists("start_request", hashes, block_size, keys_out)
    if (type(seed) is not bytes or len(seed) != DIGEST_BYTES
            or type(tokens) not in (list, tuple) or not tokens
            or not all(type(t) is int and 0 <= t < _TOKEN_LIMIT for t in tokens)):
        return None
    copy = list(tokens)
    _hash_blocks(hashes, copy, 0, len(copy) // block_size, block_size, seed, extras,
                 keys_out)
    return copy


def extend_request(hashes: list[bytes], tokens: Sequence[int], block_size: int,
                   seed: bytes, extras: HashExtras | None,
                   keys_out: list[list[Any] | None] | None) -> bool:
    """Append to ``hashes`` the chained hashes of the full blocks of ``block_size`` tokens
    of ``tokens`` past the ``len(hashes)`` already hashed (the first parent: the last of
    ``hashes``, else ``seed``) and, when ``extras`` set anything, their keys to
    ``keys_out`` (a list, or ``None``), exactly as :func:`start_request` hashes a prompt:
    :meth:`BlockHasher.extend` for a request whose extras, if any, set something.
    O(new tokens + new blocks x items).

    Returns True when done (nothing to hash included); False, with nothing changed, when
    ``tokens`` is not a list or tuple, an id of the new blocks is not a token id (``int``,
    not a subclass, in ``0 .. 2**64 - 1``) or the parent is not 32 bytes. The compiled
    twin also answers False for ids of ``2**32`` and more and for extras
    ``extra_tails`` does not cover.

    Mutates ``hashes`` and ``keys_out`` only.

    Raises:
        TypeError: ``hashes`` not a list, ``keys_out`` neither a list nor ``None``.
        ValueError: ``block_size`` < 1.
    """
    _check_lists("extend_request", hashes, block_size, keys_out)
    if type(tokens) not in (list, tuple):
        return False
    done = len(hashes)
    n = len(tokens) // block_size - done
    if n <= 0:
        return True
    parent = hashes[-1] if hashes else seed
    new = tokens[done * block_size:(done + n) * block_size]
    if (type(parent) is not bytes or len(parent) != DIGEST_BYTES
            or not all(type(t) is int and 0 <= t < _TOKEN_LIMIT for t in new)):
        return False
    _hash_blocks(hashes, tokens, done, n, block_size, parent, extras, keys_out)
    return True


def _check_lists(name: str, hashes: object, block_size: int, keys_out: object) -> None:
    """The kernels' argument checks (their Raises)."""
    if type(hashes) is not list or (keys_out is not None and type(keys_out) is not list):
        raise TypeError(f"{name}: hashes must be a list, keys_out a list or None")
    if block_size < 1:
        raise ValueError(f"{name}: block_size must be >= 1")


def _hash_blocks(hashes: list[bytes], tokens: Sequence[int], first: int, n: int,
                 block_size: int, parent: bytes, extras: HashExtras | None,
                 keys_out: list[list[Any] | None] | None) -> None:
    """Blocks ``first .. first + n - 1`` of ``tokens`` after ``parent``, appended to
    ``hashes``; their keys to ``keys_out`` when ``extras`` set anything."""
    if extras is not None and extras.is_empty:
        extras = None
    start, stop = first * block_size, (first + n) * block_size
    tails = ([_NULL] * n if extras is None
             else block_tails(extras, start, stop, block_size, keys_out))
    head = b"\x83" + cbor_head(2, DIGEST_BYTES)
    for k in range(n):
        s = start + k * block_size
        block = list(tokens[s:s + block_size])
        parent = hashlib.sha256(head + parent + encode_tokens(block) + tails[k]).digest()
        hashes.append(parent)
