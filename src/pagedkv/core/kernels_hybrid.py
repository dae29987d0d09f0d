"""The hybrid path's compiled kernels and their pure-Python twins.

Each function here is the specification of a C function of the compiled core
(``pagedkv/_csrc/ccore_hybrid*.h``) with exactly its signature, values and errors;
``tests/core/test_kernels_hybrid.py`` drives each pair side by side. They are members of
the kernel sets (:mod:`pagedkv.core.kernels`): an object takes one of a pair, once, when it
is built; no call site asks which core it runs.

* :func:`hash_keyed`: the chained block hash of blocks that carry extra keys, one
  encoded keys tail per block (the caller encodes the keys: :func:`block_tails`).
* :func:`admit_groups`: a new request's allocation in every group at once (the
  coordinator's admission: count, check, claim the hit, start the tables, grow them).
* :func:`record_stored`: one stored event of a registered run, and the blocks it
  announces (the event recorder's registration record).
* :func:`window_hit`, :func:`chunk_hit`, :func:`state_hit`: the longest hit of a
  sliding-window, chunked-local and Mamba align group (block ``i``'s hash is
  ``block_hashes[(i + 1) * stride - 1]``).

Adding one: see docs/architecture.md, "Adding a compiled kernel".

>>> tails = [b"\\xf6", b"\\xf6"]
>>> a: list[bytes] = []
>>> hash_keyed(a, list(range(8)), 0, 8, 4, bytes(32), tails), len(a)
(True, 2)
>>> hash_keyed([], [1, -1, 2, 3], 0, 4, 4, bytes(32), [b"\\xf6"])  # a token off the table
False
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from pagedkv.core.cbor import canonical_cbor, cbor_head, encode_tokens
from pagedkv.core.hash_extras import HashExtras, keys_cbor, lora_keys_cbor

__all__ = [
    "ADMIT_CHUNK", "ADMIT_FULL", "ADMIT_METHODS", "ADMIT_WINDOW", "HashKeyed", "admit_groups",
    "block_tails", "chunk_hit", "hash_keyed", "record_stored",
    "state_hit", "window_hit",
]

DIGEST_BYTES = 32
#: Token ids the compiled encoding takes (the pure fast path's token table).
TOKEN_LIMIT = 1 << 17
_NULL = b"\xf6"  # the CBOR encoding of None: a block without extra keys

HashKeyed = Callable[[list[bytes], Sequence[int], int, int, int, bytes, list[bytes]], bool]


def hash_keyed(hashes: list[bytes], tokens: Sequence[int], start: int, stop: int,
               block_size: int, parent: bytes, tails: list[bytes]) -> bool:
    """Append to ``hashes`` the SHA-256 chained hashes of the blocks of ``tokens`` in
    ``[start, stop)``: block ``k``'s hash input is the canonical CBOR array
    ``[parent, tokens, keys]`` with ``tails[k]`` the already-encoded ``keys``; the first
    parent is ``parent``, then each block's digest.

    Returns False, with nothing changed, when ``parent`` is not 32 bytes or a token is not
    an int in ``0 .. 2**17 - 1`` (the caller's checked path encodes it or raises).

    Raises:
        TypeError: ``hashes`` not a list, ``tails`` not a list of one bytes object per
            block.
        ValueError: ``[start, stop)`` is not whole blocks within ``tokens``.
    """
    if type(hashes) is not list:
        raise TypeError("hash_keyed: hashes must be a list")
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


#: Admission plan kinds (:func:`admit_groups`): a group growing by the base rule (full
#: attention), by the sliding-window or chunked-local rule, or through its own methods.
ADMIT_FULL, ADMIT_WINDOW, ADMIT_CHUNK, ADMIT_METHODS = 0, 1, 2, 3


def admit_groups(plan: list[tuple[Any, ...]], request_id: str, hit: Any, total_computed: int,
                 num_tokens: int, main_tokens: int, headroom: int, num_free: int,
                 ref_cnt: list[int], touch: Any, take: Any, zeroing: list[bool],
                 new_ids: list[list[int]]) -> tuple[list[int], ...] | None:
    """:meth:`pagedkv.core.coordinator_base.Coordinator.allocate` for a request no group
    holds, without external tokens: per group ``g`` a plan entry ``(kind, manager, tables,
    num_cached, block_size, span, ignores_lookahead)`` (``span``: the window or chunk in
    tokens). ``hit``: per-group hit blocks or None; ``main_tokens``: ``num_tokens``
    without lookahead (groups that ignore lookahead size by it); ``num_free``: the pool's
    free blocks; ``touch`` / ``take``: the pool's ``touch`` and ``get_new_blocks``.

    In order, as the coordinator: every group's need (new blocks past the hit and the
    skipped leading positions, plus hit blocks at ref count 0 that leave the free queue;
    a methods group asks ``get_num_blocks_to_allocate``); None when the need plus
    ``headroom`` exceeds ``num_free`` (nothing changed); else every group's claimed hit
    blocks touched (hit given), every table started (nulls for the skipped positions,
    then the claimed hit), every table grown to its slots (``take``), new real blocks
    of zeroed groups appended to ``new_ids[g]``. Returns the new blocks per group.
    """
    groups = len(plan)
    blocks = hit if hit is not None else [[] for _ in range(groups)]
    slots: list[int] = []
    skips: list[int] = []
    needed = 0
    for g, (kind, m, _tables, _cached, bs, span, ignores) in enumerate(plan):
        n_slots = main_tokens if ignores else num_tokens
        slots.append(n_slots)
        if kind == ADMIT_METHODS:
            skips.append(0)
            needed += m.get_num_blocks_to_allocate(request_id, n_slots, blocks[g],
                                                   total_computed)
            continue
        skipped = (0 if kind == ADMIT_FULL
                   else max(0, total_computed - span + 1) if kind == ADMIT_WINDOW
                   else total_computed // span * span) // bs
        skips.append(skipped)
        n = -(-n_slots // bs) - max(len(blocks[g]), skipped)
        needed += max(n, 0) + sum(1 for b in blocks[g][skipped:] if b and ref_cnt[b] == 0)
    if needed + headroom > num_free:
        return None
    if hit is not None:
        for g, entry in enumerate(plan):
            touch(entry[1].claimed_hit_blocks(blocks[g], total_computed)
                  if entry[0] == ADMIT_METHODS else blocks[g][skips[g]:])
    for g, (kind, m, tables, cached, _bs, _span, _ignores) in enumerate(plan):
        if kind == ADMIT_METHODS:
            m.save_new_computed_blocks(request_id, blocks[g], total_computed)
            continue
        table = [0] * skips[g]
        table.extend(blocks[g][skips[g]:])
        tables[request_id] = table
        cached[request_id] = len(table)
    out: list[list[int]] = []
    for g, (kind, m, tables, _cached, bs, _span, _ignores) in enumerate(plan):
        if kind == ADMIT_METHODS:
            new = m.allocate_new_blocks(request_id, slots[g])
        else:
            table = tables[request_id]
            n = -(-slots[g] // bs) - len(table)
            new = take(n) if n > 0 else []
            table.extend(new)
        if zeroing[g] and new:
            new_ids[g].extend(b for b in new if b)
        out.append(new)
    return tuple(out)


def record_stored(events: list[Any], announced: dict[int, Any], cls: type, blocks: Any,
                  hashes: list[bytes], start: int, end: int, skipped: Any, token_ids: Any,
                  block_size: int, lora_id: int | None, medium: str | None,
                  lora_name: str | None, extra: list[Any] | None, group: int, kind: str | None,
                  window: int | None) -> None:
    """Append to ``events`` one ``cls`` record (a named tuple of 12 fields, as
    :class:`pagedkv.core.records.BlockStored`) for table positions ``[start, end)`` of
    ``blocks`` but the ascending ``skipped`` ones: the listed positions' hashes, the hash
    before ``start`` as parent (None at 0), ``token_ids[start * block_size : end *
    block_size]``, the LoRA and medium fields, ``extra`` (one entry per listed position;
    None: a None each; an empty list becomes None), the group and its kind and window,
    no lookahead ids. Then ``announced[blocks[i]] = (record, k, i - start, hashes[i - 1]
    or None at 0)`` for the k-th listed position i. Raises as indexing does."""
    if skipped:
        left_out = set(skipped)
        positions: Any = [i for i in range(start, end) if i not in left_out]
        listed = [hashes[i] for i in positions]
    else:
        positions = range(start, end)
        listed = hashes[start:end]
    if extra is None:
        extra = [None] * len(positions)
    bs = block_size
    record: Any = tuple.__new__(cls, (
        listed, hashes[start - 1] if start else None, token_ids[start * bs:end * bs], bs,
        lora_id, medium, lora_name, extra or None, group, kind, window, None))
    events.append(record)
    for k, i in enumerate(positions):
        announced[blocks[i]] = (record, k, i - start, hashes[i - 1] if i else None)


def _strided(block_hashes: list[bytes], stride: int) -> list[bytes]:
    if type(block_hashes) is not list:
        raise TypeError("block_hashes must be a list")
    if stride <= 0:
        raise ValueError("stride must be positive")
    return block_hashes if stride == 1 else block_hashes[stride - 1 :: stride]


def window_hit(index: dict[bytes, int], block_hashes: list[bytes], stride: int,
               num_blocks: int, need: int) -> list[int]:
    """The rightmost run of ``need`` cached blocks among blocks ``[0, num_blocks)``, nulls
    before it; else the cached run from block 0 (possibly empty); ``need <= 0``: all
    ``num_blocks`` null. Raises IndexError past the hashes. No state change."""
    hashes = _strided(block_hashes, stride)
    if need <= 0:
        return [0] * max(num_blocks, 0)
    run: list[int] = []  # right to left
    for i in range(num_blocks - 1, -1, -1):
        b = index.get(hashes[i])
        if b is None:
            run.clear()
            continue
        run.append(b)
        if len(run) == need:
            run.reverse()
            out = [0] * i
            out.extend(run)
            return out
    run.reverse()
    return run


def chunk_hit(index: dict[bytes, int], block_hashes: list[bytes], stride: int, first: int,
              num_blocks: int) -> list[int]:
    """``first`` nulls (the blocks before the chunk), then the cached blocks from block
    ``first`` up to the first miss below ``num_blocks``. Raises IndexError past the
    hashes. No state change."""
    hashes = _strided(block_hashes, stride)
    first = max(first, 0)
    out = [0] * first
    for i in range(first, num_blocks):
        b = index.get(hashes[i])
        if b is None:
            break
        out.append(b)
    return out


def state_hit(index: dict[bytes, int], block_hashes: list[bytes], stride: int,
              num_blocks: int, block_size: int, align: int) -> list[int]:
    """The rightmost cached block ``i < num_blocks`` whose end ``(i + 1) * block_size`` is
    a multiple of ``align``, nulls before it; else ``[]``. Raises IndexError past the
    hashes, ValueError for ``align <= 0``. No state change."""
    hashes = _strided(block_hashes, stride)
    if align <= 0:
        raise ValueError("state_hit: align must be positive")
    for i in range(num_blocks - 1, -1, -1):
        b = index.get(hashes[i])
        if b is not None and not (i + 1) * block_size % align:
            out = [0] * i
            out.append(b)
            return out
    return []


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
