"""The hybrid request's kernels beside the allocation ones: the extra keys' encodings of a
request's new blocks (:func:`extra_tails`), and the keyed hashing step that uses them
(:func:`extend_with_tails`).

Each kernel here is the pure-Python specification of its compiled twin in
``pagedkv.core._ccore`` (``pagedkv/_csrc/ccore_hybrid_lookup_*.h``), with the same
signature; :class:`pagedkv.core.kernels.Kernels` names one of the two. A compiled kernel
may answer ``None`` ("not covered here", nothing changed) where its contract says so; the
pure one always covers.

>>> from pagedkv.core.hash_extras import HashExtras, LoRA
>>> keys = []
>>> extra_tails(HashExtras(lora=LoRA("a", 1, "p"), cache_salt="s"), 0, 8, 4, keys)
[b'\\x82\\x83dloraaaap\\x82jcache_saltas', b'\\x81\\x83dloraaaap']
>>> keys
[[['lora', 'a', 'p'], ['cache_salt', 's']], [['lora', 'a', 'p']]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pagedkv.core.hash_extras import HashExtras
from pagedkv.core.kernels_hybrid import HashKeyed, block_tails

__all__ = ["ExtraTails", "extend_with_tails", "extra_tails"]

#: ``extra_tails(extras, start, stop, block_size, keys_out) -> list[bytes] | None``.
ExtraTails = Callable[[HashExtras, int, int, int, "list[list[Any] | None] | None"],
                      "list[bytes] | None"]


def extra_tails(extras: HashExtras, start: int, stop: int, block_size: int,
                keys_out: list[list[Any] | None] | None) -> list[bytes] | None:
    """Per block of tokens ``[start, stop)`` (``stop - start`` a multiple of
    ``block_size``), the canonical CBOR of its extra keys (``b"\\xf6"`` for none), and
    each block's keys (a list, or ``None``) appended to ``keys_out`` when it is a list.
    Exactly :func:`pagedkv.core.kernels_hybrid.block_tails`. O(blocks x items).

    Mutates ``keys_out`` only. The compiled twin returns ``None``, with nothing changed,
    for extras it does not cover: prompt embeddings, a LoRA path that is not a ``str``,
    text that UTF-8 cannot encode; the pure one covers everything.

    >>> from pagedkv.core.hash_extras import MultiModalItem
    >>> extras = HashExtras(mm_items=(MultiModalItem("img", 6, 4),))
    >>> keys = []
    >>> extra_tails(extras, 0, 12, 4, keys)[0]
    b'\\xf6'
    >>> keys
    [None, [['mm', 'img', 2]], [['mm', 'img', -2]]]
    """
    return block_tails(extras, start, stop, block_size, keys_out)


def extend_with_tails(tails_fn: ExtraTails, kernel_fn: HashKeyed, hashes: list[bytes],
                      tokens: Sequence[int], start: int, stop: int, block_size: int,
                      parent: bytes, extras: HashExtras,
                      keys_out: list[list[Any] | None] | None) -> bool:
    """:meth:`pagedkv.core.hashing.BlockHasher.extend` with extras: the blocks' tails by
    ``tails_fn`` (an :data:`ExtraTails`; :func:`block_tails` where it does not cover the
    extras), then one ``kernel_fn`` call (a ``HashKeyed``). The keys join ``keys_out`` only
    when the kernel hashed; False: nothing changed. O(blocks x items)."""
    keys: list[list[Any] | None] | None = [] if keys_out is not None else None
    tails = tails_fn(extras, start, stop, block_size, keys)
    if tails is None:
        tails = block_tails(extras, start, stop, block_size, keys)
    if not kernel_fn(hashes, tokens, start, stop, block_size, parent, tails):
        return False
    if keys_out is not None and keys is not None:
        keys_out.extend(keys)
    return True
