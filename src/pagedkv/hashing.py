"""Chained block hashes: a digest that identifies a full block *and everything before it*.

``h_i = H(canonical_cbor([h_{i-1}, tokens_i, extra_keys_i]))`` with ``h_{-1}`` a fixed seed.
Equal hashes therefore mean equal prefixes. The default ``H`` is SHA-256 over canonical CBOR
(RFC 8949 §4.2.1 core deterministic encoding), byte-compatible with vLLM's ``sha256_cbor``,
so other systems can compute the same hashes; the digest depends on nothing but its input
(not on ``PYTHONHASHSEED``, the process or the machine). ``xxhash_cbor`` (xxHash3-128 over
the same bytes) is the fast option and needs the ``fast`` extra.

Seed: ``H(canonical_cbor("vllm-none-hash"))`` by default, or, with a per-deployment secret,
``H(canonical_cbor(["pagedkv-secret-seed", secret]))`` so hashes cannot be predicted by
outsiders.

Extra keys (one list per block, ``None`` when empty), in this order:
``["lora", lora_name]``; per multimodal item overlapping the block
``["mm", identifier, item_offset - block_start]``; on the first block only
``["cache_salt", salt]``; for prompt embeddings ``["embeds", sha256(block's embedding
bytes)]``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pagedkv.errors import InvalidArgumentError, require

__all__ = [
    "HASH_ALGOS",
    "BlockHasher",
    "LoRA",
    "MultiModalItem",
    "canonical_cbor",
]

HASH_ALGOS = ("sha256_cbor", "xxhash_cbor")
_NONE_HASH_INPUT = "vllm-none-hash"


class LoRA(NamedTuple):
    """A LoRA adapter: ``name`` keys the hash, ``adapter_id`` goes into events."""

    name: str
    adapter_id: int


class MultiModalItem(NamedTuple):
    """A multimodal input (image, audio…) occupying prompt tokens
    ``[offset, offset + length)``; ``identifier`` is the hash of its content."""

    identifier: str
    offset: int
    length: int


# ---------------------------------------------------------------- canonical CBOR


def _head(major: int, value: int) -> bytes:
    mt = major << 5
    if value < 24:
        return bytes((mt | value,))
    if value < 0x100:
        return bytes((mt | 24, value))
    if value < 0x10000:
        return struct.pack(">BH", mt | 25, value)
    if value < 0x100000000:
        return struct.pack(">BI", mt | 26, value)
    if value < 0x10000000000000000:
        return struct.pack(">BQ", mt | 27, value)
    raise InvalidArgumentError(f"integer {value} is too large for CBOR encoding (max 2**64-1)")


def _encode_float(value: float) -> bytes:
    # Deterministic encoding: the shortest IEEE 754 form that represents the value exactly.
    for fmt, lead in (("e", 0xF9), ("f", 0xFA)):
        try:
            packed = struct.pack(">" + fmt, value)
        except OverflowError:
            continue
        if struct.unpack(">" + fmt, packed)[0] == value or value != value:
            return bytes((lead,)) + packed
    return b"\xfb" + struct.pack(">d", value)


def _encode(obj: Any, out: list[bytes]) -> None:
    if obj is None:
        out.append(b"\xf6")
    elif obj is True:
        out.append(b"\xf5")
    elif obj is False:
        out.append(b"\xf4")
    elif isinstance(obj, int):
        out.append(_head(0, obj) if obj >= 0 else _head(1, -1 - obj))
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        out.append(_head(2, len(data)))
        out.append(data)
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        out.append(_head(3, len(data)))
        out.append(data)
    elif isinstance(obj, (list, tuple)):
        out.append(_head(4, len(obj)))
        for item in obj:
            _encode(item, out)
    elif isinstance(obj, dict):
        items = sorted((canonical_cbor(k), v) for k, v in obj.items())
        out.append(_head(5, len(items)))
        for key_bytes, value in items:
            out.append(key_bytes)
            _encode(value, out)
    elif isinstance(obj, float):
        out.append(_encode_float(obj))
    else:
        raise InvalidArgumentError(
            f"cannot CBOR-encode a {type(obj).__name__} in a block hash input; "
            "extra keys may hold None, bool, int, float, str, bytes, lists and dicts"
        )


def canonical_cbor(obj: Any) -> bytes:
    """Canonical (deterministic) CBOR encoding of ``obj``.

    Supports None, bool, int (-2**64 .. 2**64-1), float, str, bytes, list/tuple (arrays)
    and dict (keys sorted by their encoding).

    Raises:
        InvalidArgumentError: an unsupported type or an out-of-range integer.
    """
    out: list[bytes] = []
    _encode(obj, out)
    return b"".join(out)


# NOTE: token ids are encoded through a lookup table of pre-encoded CBOR unsigned ints:
# one C-level list index per token instead of a branchy Python encode (hashing a prompt went
# from 9.0 to 5.4 us per 16-token block under load; see benchmarks/README.md, "hashing").
# The table ends with a poisoned half (None entries) so a negative id, which Python would
# index from the end, or an id past the table, fails the join and takes the checked path.
_TABLE_SIZE = 1 << 17
_token_table: list[bytes | None] = []


def _build_token_table() -> list[bytes | None]:
    if not _token_table:
        pack2 = struct.Struct(">BH").pack
        pack4 = struct.Struct(">BI").pack
        _token_table.extend(bytes((i,)) for i in range(24))
        _token_table.extend(bytes((0x18, i)) for i in range(24, 256))
        _token_table.extend(pack2(0x19, i) for i in range(256, 0x10000))
        _token_table.extend(pack4(0x1A, i) for i in range(0x10000, _TABLE_SIZE))
        _token_table.extend([None] * _TABLE_SIZE)
    return _token_table


def _encode_tokens(tokens: Sequence[int]) -> bytes:
    """Canonical CBOR array of non-negative token ids.

    Raises:
        InvalidArgumentError: a token id that is not a non-negative int.
    """
    table: list[Any] = _token_table or _build_token_table()
    try:
        return _head(4, len(tokens)) + b"".join(map(table.__getitem__, tokens))
    except (IndexError, TypeError):
        pass
    for t in tokens:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise InvalidArgumentError(f"token ids must be non-negative ints, got {t!r}")
    return canonical_cbor(list(tokens))


# ---------------------------------------------------------------- hash functions


def _hash_ctor(algo: str) -> Callable[[bytes], Any]:
    """The hash object constructor for ``algo``; ``ctor(data).digest()`` is the digest."""
    if algo == "sha256_cbor":
        return hashlib.sha256
    if algo == "xxhash_cbor":
        xxhash: Any = require("xxhash", "fast", "the xxhash_cbor block hash")
        return xxhash.xxh3_128  # type: ignore[no-any-return]
    raise InvalidArgumentError(f"unknown hash algorithm {algo!r}; choose one of {HASH_ALGOS}")


class BlockHasher:
    """Computes chained hashes of full blocks of ``block_size`` tokens.

    Stateless apart from its configuration; requests keep their own hash lists and call
    :meth:`extend` when they grow, so each block is hashed exactly once.
    """

    __slots__ = ("_ctor", "algo", "block_size", "seed")

    def __init__(
        self, block_size: int, *, algo: str = "sha256_cbor", secret_seed: bytes | None = None
    ) -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise InvalidArgumentError(f"block_size must be a positive int, got {block_size!r}")
        self.block_size = block_size
        self.algo = algo
        self._ctor = _hash_ctor(algo)
        seed_input: Any = (
            _NONE_HASH_INPUT if secret_seed is None else ["pagedkv-secret-seed", secret_seed]
        )
        #: The parent hash of a request's first block.
        self.seed: bytes = self._ctor(canonical_cbor(seed_input)).digest()

    def hash_block(
        self, parent: bytes, tokens: Sequence[int], extra_keys: list[Any] | None = None
    ) -> bytes:
        """The hash of one block given its parent hash, its token ids and extra keys."""
        if extra_keys is None:
            extra = b"\xf6"
        else:
            extra = canonical_cbor(extra_keys)
        data = b"\x83" + _head(2, len(parent)) + parent + _encode_tokens(tokens) + extra
        digest: bytes = self._ctor(data).digest()
        return digest

    def extend(
        self,
        hashes: list[bytes],
        token_ids: Sequence[int],
        *,
        lora: LoRA | None = None,
        mm_items: Sequence[MultiModalItem] = (),
        cache_salt: str | None = None,
        prompt_embeds: Sequence[bytes] | None = None,
    ) -> None:
        """Append to ``hashes`` the hash of every full block of ``token_ids`` not hashed yet.

        Mutates ``hashes`` only. Cost: one hash per new full block.
        """
        bs = self.block_size
        start = len(hashes) * bs
        end = len(token_ids) - bs
        if start > end:
            return
        ctor = self._ctor
        parent = hashes[-1] if hashes else self.seed
        plain = lora is None and not mm_items and cache_salt is None and prompt_embeds is None
        if plain:
            # Fast path: encode every token once, then one join and one digest per block.
            table: list[Any] = _token_table or _build_token_table()
            head = b"\x83" + _head(2, len(parent))
            array_head = _head(4, bs)
            join = b"".join
            append = hashes.append
            try:
                enc = list(map(table.__getitem__, token_ids[start : end + bs]))
                payloads = [join(enc[s : s + bs]) for s in range(0, end + 1 - start, bs)]
                for payload in payloads:
                    parent = ctor(join((head, parent, array_head, payload, b"\xf6"))).digest()
                    append(parent)
                return
            except (IndexError, TypeError):
                # An id outside the table: the checked path below encodes it or raises.
                start = len(hashes) * bs
        for s in range(start, end + 1, bs):
            tokens = token_ids[s : s + bs]
            keys = block_extra_keys(
                s, s + bs, lora=lora, mm_items=mm_items, cache_salt=cache_salt,
                prompt_embeds=prompt_embeds,
            ) if not plain else None
            parent = self.hash_block(parent, tokens, keys)
            hashes.append(parent)


def block_extra_keys(
    start: int,
    end: int,
    *,
    lora: LoRA | None = None,
    mm_items: Sequence[MultiModalItem] = (),
    cache_salt: str | None = None,
    prompt_embeds: Sequence[bytes] | None = None,
) -> list[Any] | None:
    """Extra hash keys of the block of tokens ``[start, end)``; ``None`` when it has none."""
    keys: list[Any] = []
    if lora is not None:
        keys.append(["lora", lora.name])
    for item in mm_items:
        if item.offset < end and item.offset + item.length > start:
            keys.append(["mm", item.identifier, item.offset - start])
    if cache_salt is not None and start == 0:
        keys.append(["cache_salt", cache_salt])
    if prompt_embeds is not None and start < len(prompt_embeds):
        digest = hashlib.sha256(b"".join(prompt_embeds[start:end])).digest()
        keys.append(["embeds", digest])
    return keys or None
