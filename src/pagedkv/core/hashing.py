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

Extra keys (one list per block, ``None`` when empty), in this order, as vLLM 0.33 builds
them: ``["lora", lora_name, lora_path]`` (the path too, so re-pointing a name at another
adapter cannot reuse stale KV); per multimodal item overlapping the block
``["mm", identifier, item_offset - block_start]``; on the first block only and only for a
non-empty salt ``["cache_salt", salt]`` (``""`` is no salt); for prompt embeddings
``["prompt_embeds", sha256(block's embedding bytes)]``. KV-cache events carry them untagged
(:func:`event_extra_keys`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from pagedkv.core.cbor import block_payloads, canonical_cbor, cbor_head, encode_tokens, token_table
from pagedkv.core.hash_extras import (
    HashExtras,
    LoRA,
    MultiModalItem,
    event_extra_keys,
    keys_cbor,
    lora_keys_cbor,
)
from pagedkv.core.kernels import PURE, kernels
from pagedkv.core.kernels_hybrid_lookup import extend_with_tails
from pagedkv.core.kernels_pure import CHUNK_TOKENS
from pagedkv.errors import InvalidArgumentError, require

__all__ = [
    "HASH_ALGOS",
    "BlockHasher",
    "HashExtras",
    "LoRA",
    "MultiModalItem",
    "canonical_cbor",
    "event_extra_keys",
]

HASH_ALGOS = ("sha256_cbor", "xxhash_cbor")
_CHUNK_TOKENS = CHUNK_TOKENS  # (hashing_lookahead reads it here)
_NULL = b"\xf6"  # the CBOR encoding of None: a block without extra keys
_NONE_HASH_INPUT = "vllm-none-hash"


def _hash_ctor(algo: str) -> Callable[[bytes], Any]:
    """The hash object constructor for ``algo``; ``ctor(data).digest()`` is the digest."""
    if algo == "sha256_cbor":
        return hashlib.sha256
    if algo == "xxhash_cbor":
        xxhash: Any = require("xxhash", "fast", "the xxhash_cbor block hash")
        ctor: Callable[[bytes], Any] = xxhash.xxh3_128
        return ctor
    raise InvalidArgumentError(f"unknown hash algorithm {algo!r}; choose one of {HASH_ALGOS}")


class BlockHasher:
    """Computes chained hashes of full blocks of ``block_size`` tokens.

    Requests keep their own hash lists and call :meth:`extend` when they grow, so each
    block of a request is hashed once. Across requests, the hashes of recently seen blocks
    (same parent, same tokens: a shared system prompt, an earlier turn of a chat) are
    remembered in a bounded memo of about ``memo_blocks`` blocks, keyed by the whole hash
    input (two generations of at most ``memo_blocks`` entries each, or one call's blocks
    when a call brings more; the older is dropped whole when a call would take the newer
    past ``memo_blocks``: O(1) per block, ~200 bytes per entry). ``memo_blocks=0`` turns it
    off. The memo never changes a digest; it only skips recomputing one. The compiled core
    (:mod:`pagedkv.core.kernels`) hashes plain blocks in C without it: there a block's
    encoding and SHA-256 cost less than a memo probe, so its memo stays empty.

    One hasher may be shared by threads (e.g. a front end hashing requests while the
    scheduler runs): a race on the memo can only lose entries, never yield a wrong digest,
    since every entry is keyed by its full input.

    >>> hasher = BlockHasher(4)
    >>> hashes: list[bytes] = []
    >>> hasher.extend(hashes, list(range(10)))     # 2 full blocks; tokens 8, 9 wait
    >>> len(hashes), hashes[1] == hasher.hash_block(hashes[0], [4, 5, 6, 7])
    (2, True)
    >>> hasher.extend(hashes, list(range(12))); len(hashes)   # only block 2 is new
    3
    """

    __slots__ = ("_array_head", "_ctor", "_head", "_keyed", "_memo", "_memo_old", "_plain",
                 "_start", "_step", "_tails", "algo", "block_size", "memo_blocks", "seed")

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
        # The constant parts of a block's hash input: the 3-array head with the parent's
        # bytes head (a digest's length), and the token array's head.
        self._head = b"\x83" + cbor_head(2, len(self.seed))
        self._array_head = cbor_head(4, block_size)
        # The plain-block and keyed-block kernels (pagedkv.core.kernels), picked once: the
        # compiled ones implement sha256_cbor only; the pure set has no keyed kernel (the
        # memo path below is its faster Python form).
        k = kernels() if algo == "sha256_cbor" else PURE
        self._plain = k.hash_plain
        self._keyed = k.hash_keyed
        self._tails = k.extra_tails
        #: The request kernels (``start_request``, ``extend_request``)
        #: :class:`pagedkv.core.request.Request` hashes a prompt and its growth with, or
        #: None: the pure set, or a subclass hashing its own way (its :meth:`extend` then
        #: hashes every block).
        own = type(self).extend is BlockHasher.extend
        self._start = k.start_request if own else None
        self._step = k.extend_request if own else None

    def hash_block(
        self, parent: bytes, tokens: Sequence[int], extra_keys: list[Any] | None = None
    ) -> bytes:
        """The hash of one block given its parent hash, its token ids and extra keys."""
        if extra_keys is None:
            extra = b"\xf6"
        else:
            extra = canonical_cbor(extra_keys)
        data = b"\x83" + cbor_head(2, len(parent)) + parent + encode_tokens(tokens) + extra
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
        stop = len(token_ids) // bs * bs
        if start >= stop:
            return
        if extras is None:
            if self._plain(self, hashes, token_ids, start, stop, bs):
                return  # the common call: blocks without extra keys
        elif self._keyed is not None and extend_with_tails(
                self._tails, self._keyed, hashes, token_ids, start, stop, bs,
                hashes[-1] if hashes else self.seed, extras, keys_out):
            return  # the same, with extras
        if hashes and len(hashes[-1]) != len(self.seed):
            # A caller-supplied parent of another length: its block the checked way, then
            # every parent is a digest of this hasher.
            self._extend_checked(hashes, token_ids, start, start, hashes[-1], extras, keys_out)
            start += bs
            if start >= stop:
                return
            if extras is None and self._plain(self, hashes, token_ids, start, stop, bs):
                return
        if extras is not None:
            try:
                self._extend_keyed(hashes, token_ids, start, stop, extras, keys_out)
                return
            except (IndexError, TypeError):
                # An id outside the token table: the checked path below encodes it or
                # raises (raised before the failing chunk's first block was hashed, so the
                # hashes and the recorded keys are still in step).
                start = len(hashes) * bs
        # (Without extras: the plain kernel met an id outside the token table.)
        parent = hashes[-1] if hashes else self.seed
        self._extend_checked(hashes, token_ids, start, stop - bs, parent, extras, keys_out)

    def _memo_for(self, num_new: int) -> dict[bytes, bytes]:
        """The newer memo generation, rotated first when ``num_new`` more entries would
        take it past ``memo_blocks`` (so a generation holds at most ``memo_blocks`` entries,
        or one call's blocks when a call brings more)."""
        memo = self._memo
        if len(memo) + num_new > self.memo_blocks:
            self._memo_old = memo
            self._memo = memo = {}
        return memo

    def hash_payloads(self, hashes: list[bytes], payloads: list[Any]) -> None:
        """Append the hashes of blocks without extra keys whose encoded tokens are
        ``payloads`` (``pagedkv.core.cbor.block_payloads``), chained on ``hashes[-1]`` (a
        digest of this hasher) or the seed: one digest or one memo hit per block. The
        pure ``hash_plain`` kernel's step (:mod:`pagedkv.core.kernels_pure`).

        NOTE: the memo key is the whole hash input (so an entry can never give a wrong
        digest) and a repeated block costs one dict lookup instead of a digest
        (benchmarks/micro.py, "hashing memo"). Chained hashes: once one block misses, every
        later block misses too (its parent is new), so lookups stop at the first miss and
        the rest is only inserted.
        """
        parent = hashes[-1] if hashes else self.seed
        ctor = self._ctor
        head = self._head
        array_head = self._array_head
        join = b"".join
        append = hashes.append
        if not self.memo_blocks:
            for payload in payloads:
                parent = ctor(join((head, parent, array_head, payload, _NULL))).digest()
                append(parent)
            return
        memo = self._memo_for(len(payloads))
        old = self._memo_old
        rest = iter(payloads)
        for payload in rest:
            data = join((head, parent, array_head, payload, _NULL))
            h = memo.get(data)
            if h is None:
                h = old.get(data)
                if h is None:
                    parent = ctor(data).digest()
                    append(parent)
                    memo[data] = parent
                    break
                memo[data] = h
            parent = h
            append(h)
        for payload in rest:
            data = join((head, parent, array_head, payload, _NULL))
            parent = ctor(data).digest()
            append(parent)
            memo[data] = parent

    def _extend_checked(
        self,
        hashes: list[bytes],
        token_ids: Sequence[int],
        start: int,
        end: int,
        parent: bytes,
        extras: HashExtras | None,
        keys_out: list[list[Any] | None] | None,
    ) -> None:
        """The blocks starting at tokens ``start .. end`` (step ``block_size``) after
        ``parent``, each encoded on its own: any token id (``encode_tokens`` takes ids of
        2**17 and more, and raises on ids that are not ids) and any parent length."""
        bs = self.block_size
        # Consecutive blocks often carry equal keys (a LoRA adapter on every block):
        # their CBOR encoding is reused instead of re-encoded.
        last_keys: list[Any] | None = None
        last_encoded = b"\xf6"
        ctor = self._ctor
        for s in range(start, end + 1, bs):
            tokens = token_ids[s : s + bs]
            keys = None if extras is None else extras.block_keys(s, s + bs)
            if keys != last_keys:
                last_keys = keys
                last_encoded = b"\xf6" if keys is None else canonical_cbor(keys)
            parent = ctor(b"\x83" + cbor_head(2, len(parent)) + parent + encode_tokens(tokens)
                          + last_encoded).digest()
            hashes.append(parent)
            if keys_out is not None and extras is not None:
                keys_out.append(keys)

    def _extend_keyed(
        self,
        hashes: list[bytes],
        token_ids: Sequence[int],
        start: int,
        stop: int,
        extras: HashExtras,
        keys_out: list[list[Any] | None] | None,
    ) -> None:
        """:meth:`extend` with extras for the blocks in ``[start, stop)``, on the fast
        token encoding: per block, its keys, then one digest or one memo hit (memo as in
        :meth:`hash_payloads`: keyed by the whole hash input).

        Most blocks carry only the LoRA key (or nothing): those *plain* blocks reuse one
        encoding; only blocks a multimodal item overlaps, the salted first block and
        blocks with prompt embeddings go through :meth:`HashExtras.block_keys` (their
        encoding cached, see :func:`~pagedkv.core.hash_extras.keys_cbor`).

        Raises:
            IndexError, TypeError: a token id outside the encoding table (from
                ``block_payloads``, before the chunk's first block is hashed).
        """
        bs = self.block_size
        ctor = self._ctor
        parent = hashes[-1] if hashes else self.seed
        table = token_table()
        head = self._head
        array_head = self._array_head
        join = b"".join
        append = hashes.append
        record = keys_out.append if keys_out is not None else None
        lora = extras.lora
        plain_tail = _NULL if lora is None else lora_keys_cbor(lora.name, lora.path)
        # Keys of str and int only (a LoRA path of another type is encoded every time).
        cache_keys = lora is None or type(lora.path) is str
        # Token offsets of the blocks that are not plain (every block with embeddings).
        special = (
            None if extras.prompt_embeds is not None
            else {s for item in extras.mm_items
                  for s in range(item.offset // bs * bs, item.offset + item.length, bs)}
        )
        if special is not None and extras.cache_salt:
            special.add(0)
        chunk = max(1, _CHUNK_TOKENS // bs) * bs
        use_memo = self.memo_blocks > 0
        looking = use_memo
        for c in range(start, stop, chunk):
            payloads = block_payloads(token_ids[c : min(c + chunk, stop)], bs, table)
            memo = self._memo_for(len(payloads)) if use_memo else None
            old = self._memo_old
            s = c
            for payload in payloads:
                keys: list[Any] | None
                if special is None or s in special:
                    keys = extras.block_keys(s, s + bs)
                    tail = (_NULL if keys is None
                            else keys_cbor(keys) if cache_keys else canonical_cbor(keys))
                else:
                    keys = None if lora is None else [["lora", lora.name, lora.path]]
                    tail = plain_tail
                s += bs
                if record is not None:
                    record(keys)
                data = join((head, parent, array_head, payload, tail))
                if memo is None:
                    parent = ctor(data).digest()
                    append(parent)
                    continue
                if looking:
                    h = memo.get(data)
                    if h is None:
                        h = old.get(data)
                        if h is not None:
                            memo[data] = h
                    if h is not None:
                        parent = h
                        append(h)
                        continue
                    looking = False
                parent = ctor(data).digest()
                append(parent)
                memo[data] = parent
