"""The new request's kernel: its prompt's token ids checked and copied, and its full
blocks hashed, in one call (:func:`start_request`).

:func:`start_request` is the pure-Python specification of its compiled twin
``pagedkv.core._ccore.start_request`` (``pagedkv/_csrc/ccore_request.h``), with the same
signature. The pure kernel set has none (``Kernels.start_request`` is ``None`` there):
:class:`pagedkv.core.request.Request`'s checked path, which :meth:`BlockHasher.extend`
hashes, is its Python form, as for ``hash_keyed``. Where the compiled kernel answers a
list, it is this function's answer, with the same changes to ``hashes`` and ``keys_out``.

>>> from pagedkv.core.hashing import BlockHasher
>>> hasher, hashes = BlockHasher(2), []
>>> start_request(hashes, (5, 6, 7), 2, hasher.seed, None, None)
[5, 6, 7]
>>> hashes == [hasher.hash_block(hasher.seed, [5, 6])]
True
>>> start_request(hashes, [5, -1], 2, hasher.seed, None, None) is None   # not token ids
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from pagedkv.core.cbor import cbor_head, encode_tokens
from pagedkv.core.hash_extras import HashExtras
from pagedkv.core.kernels_hybrid import DIGEST_BYTES, block_tails

__all__ = ["StartRequest", "start_request"]

#: ``start_request(hashes, tokens, block_size, seed, extras, keys_out) -> list[int] |
#: None``.
StartRequest = Callable[
    [list[bytes], Sequence[int], int, bytes, "HashExtras | None",
     "list[list[Any] | None] | None"],
    "list[int] | None",
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
    if type(hashes) is not list or (keys_out is not None and type(keys_out) is not list):
        raise TypeError("start_request: hashes must be a list, keys_out a list or None")
    if block_size < 1:
        raise ValueError("start_request: block_size must be >= 1")
    if (type(seed) is not bytes or len(seed) != DIGEST_BYTES
            or type(tokens) not in (list, tuple) or not tokens
            or not all(type(t) is int and 0 <= t < _TOKEN_LIMIT for t in tokens)):
        return None
    copy = list(tokens)
    n = len(copy) // block_size
    if extras is not None and extras.is_empty:
        extras = None
    tails = ([_NULL] * n if extras is None
             else block_tails(extras, 0, n * block_size, block_size, keys_out))
    head = b"\x83" + cbor_head(2, DIGEST_BYTES)
    parent = seed
    for k in range(n):
        block = copy[k * block_size:(k + 1) * block_size]
        parent = hashlib.sha256(head + parent + encode_tokens(block) + tails[k]).digest()
        hashes.append(parent)
    return copy
