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
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pagedkv.errors import InvalidArgumentError, require

__all__ = [
    "HASH_ALGOS",
    "BlockHasher",
    "HashExtras",
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


@dataclass(frozen=True, slots=True, kw_only=True)
class HashExtras:
    """What makes equal tokens mean different things: a LoRA adapter, multimodal items,
    a cache salt, prompt embeddings. Part of every block hash (as *extra keys*, module
    docstring) and of every stored event. A request without any has ``None`` instead.

    >>> extras = HashExtras(lora=LoRA("sql", 1), cache_salt="tenant-7")
    >>> extras.block_keys(0, 4)
    [['lora', 'sql'], ['cache_salt', 'tenant-7']]
    >>> extras.block_keys(4, 8)
    [['lora', 'sql']]
    >>> HashExtras(mm_items=[MultiModalItem("img", 6, 4)]).block_keys(4, 8)
    [['mm', 'img', 2]]
    >>> HashExtras().is_empty
    True
    """

    lora: LoRA | None = None
    mm_items: tuple[MultiModalItem, ...] = ()
    cache_salt: str | None = None
    prompt_embeds: tuple[bytes, ...] | None = None

    def __post_init__(self) -> None:
        # Sequences given as lists become tuples: the value stays immutable and hashable.
        if not isinstance(self.mm_items, tuple):
            object.__setattr__(self, "mm_items", tuple(self.mm_items))
        if self.prompt_embeds is not None and not isinstance(self.prompt_embeds, tuple):
            object.__setattr__(self, "prompt_embeds", tuple(self.prompt_embeds))

    @property
    def is_empty(self) -> bool:
        """True when nothing is set (such extras change no hash)."""
        return (self.lora is None and not self.mm_items and self.cache_salt is None
                and self.prompt_embeds is None)

    def block_keys(self, start: int, end: int) -> list[Any] | None:
        """Extra hash keys of the block of tokens ``[start, end)``; ``None`` when it has
        none. O(number of multimodal items + embedding bytes of the block)."""
        keys: list[Any] = []
        if self.lora is not None:
            keys.append(["lora", self.lora.name])
        for item in self.mm_items:
            if item.offset < end and item.offset + item.length > start:
                keys.append(["mm", item.identifier, item.offset - start])
        if self.cache_salt is not None and start == 0:
            keys.append(["cache_salt", self.cache_salt])
        embeds = self.prompt_embeds
        if embeds is not None and start < len(embeds):
            digest = hashlib.sha256(b"".join(embeds[start:end])).digest()
            keys.append(["embeds", digest])
        return keys or None


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


# Token ids outside 256..65535 (and blocks with extra keys) are encoded through a lookup
# table of pre-encoded CBOR unsigned ints: one C-level list index per token instead of a
# branchy Python encode. The common range takes the sequential path in _block_payloads.
# The table ends with a poisoned half (None entries) so a negative id, which Python would
# index from the end, or an id past the table, fails the join and takes the checked path.
_TABLE_SIZE = 1 << 17
_CHUNK_TOKENS = 1024
_LITTLE_ENDIAN = sys.byteorder == "little"
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


_UINT16_HEAD = b"\x19" * (3 * 4096)  # CBOR head of a uint16 token, repeated


def _block_payloads(tokens: Sequence[int], bs: int, table: list[Any]) -> list[Any]:
    """The CBOR encodings (without array head) of each full block of ``tokens``.

    NOTE: ids 256..65535 encode as 3 bytes (0x19 + big-endian uint16). A chunk is encoded
    with C-level array and strided-slice operations, reading each token once in order;
    blocks holding an id outside that range are re-encoded through the lookup table. Table
    lookups cost two random memory reads per token: on a 16k-token prompt hashing took 3.6
    us per block against vLLM's 3.2 (pickle); with this 2.5 (same prompt, interleaved; with
    fresh prompts 5.2 against 6.8: benchmarks/ab_hashing.py).

    Raises:
        IndexError, TypeError: an id outside the table (the caller falls back).
    """
    num_blocks = len(tokens) // bs
    n = num_blocks * bs
    if n > len(_UINT16_HEAD) // 3:
        return [b"".join(map(table.__getitem__, tokens[s : s + bs])) for s in range(0, n, bs)]
    try:
        words = array("H", tokens[:n] if len(tokens) != n else tokens)
    except OverflowError:
        return [b"".join(map(table.__getitem__, tokens[s : s + bs])) for s in range(0, n, bs)]
    if _LITTLE_ENDIAN:
        words.byteswap()
    raw = words.tobytes()
    buf = bytearray(3 * n)
    buf[0::3] = _UINT16_HEAD[:n]
    buf[1::3] = raw[0::2]
    buf[2::3] = raw[1::2]
    encoded = bytes(buf)
    width = 3 * bs
    payloads: list[Any] = [encoded[k : k + width] for k in range(0, 3 * n, width)]
    high = raw[0::2]  # high byte 0: an id below 256, which encodes shorter
    i = high.find(0)
    while i >= 0:
        k = i // bs
        s = k * bs
        payloads[k] = b"".join(map(table.__getitem__, tokens[s : s + bs]))
        i = high.find(0, s + bs)
    return payloads


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

    Requests keep their own hash lists and call :meth:`extend` when they grow, so each
    block of a request is hashed once. Across requests, the hashes of recently seen blocks
    (same parent, same tokens: a shared system prompt, an earlier turn of a chat) are
    remembered in a bounded memo of about ``memo_blocks`` blocks (two generations of at most
    ``memo_blocks`` entries each, the older dropped whole when the newer fills: O(1) per
    block, ~200 bytes per entry). ``memo_blocks=0`` turns it off. The memo never changes a
    digest; it only skips recomputing one.

    One hasher may be shared by threads (e.g. a front end hashing requests while the
    scheduler runs): a race on the memo can only lose entries, never yield a wrong digest,
    since every entry is keyed by its full input.
    """

    __slots__ = ("_ctor", "_memo", "_memo_old", "algo", "block_size", "memo_blocks", "seed")

    def __init__(
        self,
        block_size: int,
        *,
        algo: str = "sha256_cbor",
        secret_seed: bytes | None = None,
        memo_blocks: int = 16384,
    ) -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise InvalidArgumentError(f"block_size must be a positive int, got {block_size!r}")
        if not isinstance(memo_blocks, int) or memo_blocks < 0:
            raise InvalidArgumentError(f"memo_blocks must be an int >= 0, got {memo_blocks!r}")
        self.memo_blocks = memo_blocks
        self._memo: dict[bytes, bytes] = {}
        self._memo_old: dict[bytes, bytes] = {}
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
        extras: HashExtras | None = None,
        keys_out: list[list[Any] | None] | None = None,
    ) -> None:
        """Append to ``hashes`` the hash of every full block of ``token_ids`` not hashed yet.

        ``extras`` (``None``: none) enter every hash as the block's extra keys; with
        ``extras``, the keys computed for each new block are appended to ``keys_out`` when
        given (stored events reuse them instead of deriving them again).

        Mutates ``hashes`` and ``keys_out`` only. Cost: one hash per new full block.
        """
        bs = self.block_size
        start = len(hashes) * bs
        end = len(token_ids) - bs
        if start > end:
            return
        ctor = self._ctor
        parent = hashes[-1] if hashes else self.seed
        if extras is None:
            # Fast path, in chunks of about 1,024 tokens (a cache-sized working set): the
            # chunk's block payloads (see _block_payloads), then one digest per block.
            table: list[Any] = _token_table or _build_token_table()
            head = b"\x83" + _head(2, len(parent))
            array_head = _head(4, bs)
            tail = b"\xf6"  # the null extra keys
            join = b"".join
            append = hashes.append
            chunk = max(1, _CHUNK_TOKENS // bs) * bs
            stop = end + bs
            memo_cap = self.memo_blocks
            # Chained hashes: once one block misses the memo, every later block of this
            # call misses too (its parent is new), so lookups stop at the first miss and the
            # rest is only inserted.
            looking = memo_cap > 0
            try:
                for c in range(start, stop, chunk):
                    payloads = _block_payloads(token_ids[c : min(c + chunk, stop)], bs, table)
                    if not memo_cap:
                        for payload in payloads:
                            parent = ctor(join((head, parent, array_head, payload, tail))).digest()
                            append(parent)
                        continue
                    # NOTE: the memo (class docstring) makes a repeated block cost one dict
                    # lookup instead of a digest (benchmarks/micro.py, "hashing memo").
                    memo = self._memo
                    for payload in payloads:
                        key = parent + payload
                        if looking:
                            h = memo.get(key) or self._memo_old.get(key)
                            if h is not None:
                                memo[key] = h
                                parent = h
                                append(h)
                                continue
                            looking = False
                        parent = ctor(join((head, parent, array_head, payload, tail))).digest()
                        append(parent)
                        memo[key] = parent
                        if len(memo) >= memo_cap:
                            self._memo_old = memo
                            self._memo = memo = {}
                return
            except (IndexError, TypeError):
                # An id outside the table: the checked path below encodes it or raises.
                start = len(hashes) * bs
        for s in range(start, end + 1, bs):
            tokens = token_ids[s : s + bs]
            keys = None if extras is None else extras.block_keys(s, s + bs)
            parent = self.hash_block(parent, tokens, keys)
            hashes.append(parent)
            if keys_out is not None and extras is not None:
                keys_out.append(keys)

