"""The hybrid path's compiled kernels and their pure-Python twins.

Each function here is the specification of a C function of the compiled core
(``pagedkv/_csrc/ccore_hybrid*.h``) with exactly its signature, values and errors;
``tests/core/test_kernels_hybrid.py`` drives each pair side by side. :func:`kernel` picks
one of a pair, once, when an object is built (:func:`pagedkv.core.native.active`): no call
site asks which core it runs.

* :func:`hash_keyed`: the chained block hash of blocks that carry extra keys, one
  encoded keys tail per block (the caller encodes the keys: :func:`block_tails`).

Adding one: write the twin here (its docstring is the contract), the C function in a
``ccore_hybrid*.h`` header registered in ``ccore.c`` beside the others, its entry in
``_ccore.pyi``, and a Hypothesis test of the two in ``tests/core/test_kernels_hybrid.py``.

>>> tails = [b"\\xf6", b"\\xf6"]
>>> a: list[bytes] = []
>>> hash_keyed(a, list(range(8)), 0, 8, 4, bytes(32), tails), len(a)
(True, 2)
>>> hash_keyed([], [1, -1, 2, 3], 0, 4, 4, bytes(32), [b"\\xf6"])  # a token off the table
False
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from pagedkv.core import native
from pagedkv.core.cbor import canonical_cbor, cbor_head, encode_tokens
from pagedkv.core.hash_extras import HashExtras, keys_cbor, lora_keys_cbor

__all__ = ["HashKeyed", "block_tails", "extend_keyed", "hash_keyed", "kernel"]

DIGEST_BYTES = 32
#: Token ids the compiled encoding takes (the pure fast path's token table).
TOKEN_LIMIT = 1 << 17
_NULL = b"\xf6"  # the CBOR encoding of None: a block without extra keys

HashKeyed = Callable[[list[bytes], list[int], int, int, int, bytes, list[bytes]], bool]


def hash_keyed(hashes: list[bytes], tokens: list[int], start: int, stop: int,
               block_size: int, parent: bytes, tails: list[bytes]) -> bool:
    """Append to ``hashes`` the SHA-256 chained hashes of the blocks of ``tokens`` in
    ``[start, stop)``: block ``k``'s hash input is the canonical CBOR array
    ``[parent, tokens, keys]`` with ``tails[k]`` the already-encoded ``keys``; the first
    parent is ``parent``, then each block's digest.

    Returns False, with nothing changed, when ``parent`` is not 32 bytes or a token is not
    an int in ``0 .. 2**17 - 1`` (the caller's checked path encodes it or raises).

    Raises:
        TypeError: ``hashes`` or ``tokens`` not a list, ``tails`` not a list of one bytes
            object per block.
        ValueError: ``[start, stop)`` is not whole blocks within ``tokens``.
    """
    if type(hashes) is not list or type(tokens) is not list:
        raise TypeError("hash_keyed: hashes and tokens must be lists")
    if block_size <= 0 or start < 0 or stop > len(tokens) or start > stop or (
            (stop - start) % block_size):
        raise ValueError("hash_keyed: bad block range")
    if type(tails) is not list or len(tails) != (stop - start) // block_size:
        raise TypeError("hash_keyed: tails must be a list, one per block")
    if not all(isinstance(t, bytes) for t in tails):
        raise TypeError("hash_keyed: every tail must be bytes")
    if not isinstance(parent, bytes) or len(parent) != DIGEST_BYTES:
        return False
    ids = tokens[start:stop]
    if not all(isinstance(t, int) and 0 <= t < TOKEN_LIMIT for t in ids):
        return False
    head = b"\x83" + cbor_head(2, DIGEST_BYTES)
    for k, tail in enumerate(tails):
        data = head + parent + encode_tokens(ids[k * block_size:(k + 1) * block_size]) + tail
        parent = hashlib.sha256(data).digest()
        hashes.append(parent)
    return True


def kernel(name: str) -> Any:
    """The compiled kernel ``name`` for an object built now, else its pure twin."""
    ccore = native.active()
    return getattr(ccore, name) if ccore is not None else globals()[name]


def block_tails(extras: HashExtras, start: int, stop: int, block_size: int,
                keys_out: list[list[Any] | None] | None) -> list[bytes]:
    """Per block of ``[start, stop)``, the canonical CBOR of its extra keys
    (:meth:`HashExtras.block_keys`; ``None`` encodes as ``0xf6``), and the keys themselves
    appended to ``keys_out`` when given. Blocks only the LoRA key reaches share one
    encoding; multimodal, salted and embedding blocks get their own (cached by
    :func:`keys_cbor`). O(blocks + items)."""
    bs = block_size
    lora = extras.lora
    n = (stop - start) // bs
    tails = [_NULL if lora is None else lora_keys_cbor(lora.name, lora.path)] * n
    if keys_out is not None:
        keys_out.extend(None if lora is None else [["lora", lora.name, lora.path]]
                        for _ in range(n))
    if extras.prompt_embeds is not None:
        special: Any = range(start, stop, bs)
    else:
        special = {s for item in extras.mm_items
                   for s in range(item.offset // bs * bs, item.offset + item.length, bs)}
        if extras.cache_salt:
            special.add(0)
    cache_keys = lora is None or type(lora.path) is str
    base = len(keys_out) - n if keys_out is not None else 0
    for s in special:
        if not start <= s < stop:
            continue
        keys = extras.block_keys(s, s + bs)
        k = (s - start) // bs
        tails[k] = (_NULL if keys is None
                    else keys_cbor(keys) if cache_keys else canonical_cbor(keys))
        if keys_out is not None:
            keys_out[base + k] = keys
    return tails


def extend_keyed(kernel_fn: HashKeyed, hashes: list[bytes], tokens: list[int], start: int,
                 stop: int, block_size: int, parent: bytes, extras: HashExtras,
                 keys_out: list[list[Any] | None] | None) -> bool:
    """:meth:`pagedkv.core.hashing.BlockHasher.extend` with extras on ``kernel_fn`` (a
    :data:`HashKeyed`): the blocks' keys and tails, then one kernel call; the keys join
    ``keys_out`` only when the kernel hashed (False: nothing changed)."""
    keys: list[list[Any] | None] | None = [] if keys_out is not None else None
    tails = block_tails(extras, start, stop, block_size, keys)
    if not kernel_fn(hashes, tokens, start, stop, block_size, parent, tails):
        return False
    if keys_out is not None and keys is not None:
        keys_out.extend(keys)
    return True
