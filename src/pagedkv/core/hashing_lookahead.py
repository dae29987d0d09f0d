"""Hash lookahead: block hashes that also cover the L tokens *after* each block.

With speculative decoding by a draft model that reads the target's hidden states (EAGLE,
MTP), the draft KV stored at a block's last position depends on the next L tokens as well.
A block may then be reused only by a request that agrees on those L tokens too, so its
hash covers them (vLLM 0.33's ``num_hash_lookahead_tokens``). Selected by
``CacheConfig(num_hash_lookahead_tokens=L)`` with L > 0; with L = 0 (the default) none of
this module is used.

What changes, for a block of tokens ``[s, e)`` with L > 0:

* its hash exists only once token ``e + L - 1`` is known (``L`` more tokens than usual);
* its extra keys ``E`` (:meth:`pagedkv.HashExtras.block_keys`) are taken over
  ``[s, e + L)`` (a multimodal item starting in the lookahead counts), and the hash input's
  extra-keys slot holds ``[E, t_e, ..., t_{e+L-1}]`` (``E`` may be ``None``), the block's
  token array staying the block's own tokens;
* every stored event carries ``lookahead_token_ids``: per block, those L tokens; its
  ``extra_keys`` are ``E`` untagged;
* a Mamba group's prompt checkpoint boundary leaves ``max(1, L)`` tokens after it
  (:func:`prefill_checkpoint_position`).

>>> plain = LookaheadBlockHasher(4, lookahead_tokens=2)
>>> hashes: list[bytes] = []
>>> plain.extend(hashes, [1, 2, 3, 4, 5])        # block [0, 4) needs tokens 4 and 5 too
>>> len(hashes)
0
>>> plain.extend(hashes, [1, 2, 3, 4, 5, 6])
>>> hashes[0] == plain.hash_block(plain.seed, [1, 2, 3, 4], [None, 5, 6])
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.core.cbor import block_payloads, canonical_cbor, cbor_head, token_table, uint16_run
from pagedkv.core.hash_extras import HashExtras, event_extra_keys, keys_cbor, lora_keys_cbor
from pagedkv.core.hashing import _CHUNK_TOKENS, _NULL, BlockHasher
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.recorder import EventBuffer, GroupInfo, StoredRun
from pagedkv.core.records import MEDIUM_GPU, BlockStored
from pagedkv.core.request import RequestLike
from pagedkv.errors import InvalidArgumentError

__all__ = [
    "LookaheadBlockHasher",
    "LookaheadEventBuffer",
    "apply_to_managers",
    "prefill_checkpoint_position",
]


class LookaheadBlockHasher(BlockHasher):
    """A :class:`pagedkv.BlockHasher` whose block hashes also cover the
    ``lookahead_tokens`` (L >= 1) tokens after each block (module docstring).

    Same constructor as :class:`~pagedkv.BlockHasher` plus ``lookahead_tokens``, and the
    same memo (keyed by the whole hash input, lookahead tokens included).

    >>> h = LookaheadBlockHasher(2, lookahead_tokens=1)
    >>> out: list[bytes] = []
    >>> h.extend(out, [7, 8, 9, 10, 11])    # blocks [0, 2) and [2, 4); [4, 6) is not full
    >>> out == [h.hash_block(h.seed, [7, 8], [None, 9]),
    ...         h.hash_block(out[0], [9, 10], [None, 11])]
    True
    """

    __slots__ = ("_ahead_head", "lookahead_tokens")

    def __init__(
        self,
        block_size: int,
        *,
        lookahead_tokens: int,
        algo: str = "sha256_cbor",
        secret_seed: bytes | None = None,
        memo_blocks: int = 16384,
    ) -> None:
        if type(lookahead_tokens) is not int or lookahead_tokens < 1:
            raise InvalidArgumentError(
                f"lookahead_tokens must be an int >= 1, got {lookahead_tokens!r} "
                "(use BlockHasher for no lookahead)"
            )
        super().__init__(block_size, algo=algo, secret_seed=secret_seed, memo_blocks=memo_blocks)
        self.lookahead_tokens = lookahead_tokens
        # The head of the extra-keys slot: an array of E and the L tokens.
        self._ahead_head = cbor_head(4, 1 + lookahead_tokens)

    def extend(
        self,
        hashes: list[bytes],
        token_ids: Sequence[int],
        extras: HashExtras | None = None,
        keys_out: list[list[Any] | None] | None = None,
    ) -> None:
        """Append the hash of every block not hashed yet whose L following tokens are
        known; with ``extras`` and ``keys_out``, append each block's ``E`` (its extra keys
        over the block and its lookahead) to ``keys_out``. O(new blocks)."""
        bs = self.block_size
        la = self.lookahead_tokens
        start = len(hashes) * bs
        stop = (len(token_ids) - la) // bs * bs  # blocks ending here or before are hashable
        if start >= stop:
            return
        if not hashes or len(hashes[-1]) == len(self.seed):
            try:
                self._extend_ahead(hashes, token_ids, start, stop, extras, keys_out)
                return
            except (IndexError, TypeError):
                # An id outside the token table (raised before the chunk's first block
                # was hashed): the checked way below encodes it or raises.
                start = len(hashes) * bs
        parent = hashes[-1] if hashes else self.seed
        while start < stop:
            end = start + bs
            keys = None if extras is None else extras.block_keys(start, end + la)
            ahead = token_ids[end : end + la]
            parent = self.hash_block(parent, token_ids[start:end], [keys, *ahead])
            hashes.append(parent)
            if keys_out is not None and extras is not None:
                keys_out.append(keys)
            start = end

    def _special_blocks(self, extras: HashExtras | None) -> set[int] | None:
        """The first tokens of the blocks whose window ``[s, s + bs + L)`` has keys beyond
        the LoRA adapter's (a multimodal item overlaps it, or the salted first block);
        None: every block is keyed one by one (no extras, or prompt embeddings)."""
        if extras is None or extras.prompt_embeds is not None:
            return None
        bs = self.block_size
        la = self.lookahead_tokens
        special: set[int] = set()
        for item in extras.mm_items:
            first = max(0, item.offset - bs - la + 1)
            special.update(range(-(-first // bs) * bs, item.offset + item.length, bs))
        if extras.cache_salt:
            special.add(0)
        return special

    def _extend_ahead(
        self,
        hashes: list[bytes],
        token_ids: Sequence[int],
        start: int,
        stop: int,
        extras: HashExtras | None,
        keys_out: list[list[Any] | None] | None,
    ) -> None:
        """The blocks in ``[start, stop)`` on the fast token encoding, with the memo (as
        :meth:`BlockHasher.extend`): per block its payload, the extra-keys slot ``[E,
        lookahead tokens]`` built from encoded parts, then one digest or one memo hit.

        Raises:
            IndexError, TypeError: a token id outside the encoding table.
        """
        bs = self.block_size
        la = self.lookahead_tokens
        table = token_table()
        token = table.__getitem__
        ctor = self._ctor
        head = self._head
        array_head = self._array_head
        ahead_head = self._ahead_head
        join = b"".join
        append = hashes.append
        record = keys_out.append if keys_out is not None and extras is not None else None
        lora = extras.lora if extras is not None else None
        cache_keys = lora is None or type(lora.path) is str
        # As BlockHasher._extend_keyed: blocks whose keys are only the LoRA adapter's (or
        # none) share one encoding; the others (window [s, s + bs + L) overlapping a
        # multimodal item, the salted first block, every block with embeddings) are keyed
        # one by one.
        plain_extra = _NULL if lora is None else lora_keys_cbor(lora.name, lora.path)
        special = self._special_blocks(extras)
        parent = hashes[-1] if hashes else self.seed
        chunk = max(1, _CHUNK_TOKENS // bs) * bs
        use_memo = self.memo_blocks > 0
        looking = use_memo
        for c in range(start, stop, chunk):
            end = min(c + chunk, stop)
            tokens = token_ids[c:end]
            aheads: list[bytes] | None = None
            run = uint16_run(tokens) if la <= bs and end - c > bs else None
            if run is not None and run[1].find(0) < 0:
                # Every id takes 3 bytes: a block's lookahead is the start of the next
                # block's encoding (the last one's is encoded here, before any digest).
                encoded = run[0]
                w = 3 * bs
                payloads = [encoded[k : k + w] for k in range(0, len(encoded), w)]
                aheads = [encoded[k : k + 3 * la] for k in range(w, len(encoded), w)]
                aheads.append(join(map(token, token_ids[end : end + la])))
            else:
                payloads = block_payloads(tokens, bs, table)
            memo = self._memo_for(len(payloads)) if use_memo else None
            old = self._memo_old
            s = c
            for k, payload in enumerate(payloads):
                # The lookahead first: an id outside the table raises before this block's
                # keys are recorded (hashes and keys stay in step).
                ahead = (aheads[k] if aheads is not None
                         else join(map(token, token_ids[s + bs : s + bs + la])))
                keys: list[Any] | None = None
                extra = _NULL
                if extras is not None:
                    if special is None or s in special:
                        keys = extras.block_keys(s, s + bs + la)
                        if keys is not None:
                            extra = keys_cbor(keys) if cache_keys else canonical_cbor(keys)
                    elif lora is not None:
                        keys = [["lora", lora.name, lora.path]]
                        extra = plain_extra
                    if record is not None:
                        record(keys)
                s += bs
                data = join((head, parent, array_head, payload, ahead_head, extra, ahead))
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


class LookaheadEventBuffer(EventBuffer):
    """An :class:`~pagedkv.core.recorder.EventBuffer` whose stored records carry
    ``lookahead_token_ids`` (the ``lookahead_tokens`` tokens after each listed block) and
    extra keys taken over each block and its lookahead, as vLLM 0.33 emits them with
    ``num_hash_lookahead_tokens`` > 0."""

    def __init__(
        self, groups: Sequence[GroupInfo], hash_block_size: int, lookahead_tokens: int
    ) -> None:
        super().__init__(groups, hash_block_size)
        self.lookahead_tokens = lookahead_tokens

    def _replace_last(self, event: BlockStored, blocks: Sequence[int]) -> None:
        """Swap the record just buffered for ``event`` (also where it announces blocks)."""
        old = self._events[-1]
        self._events[-1] = event
        announced = self._announced
        for b in blocks:
            entry = announced.get(b)
            if entry is not None and entry[0] is old:
                announced[b] = (event, entry[1], entry[2], entry[3])

    def stored(self, run: StoredRun) -> None:
        """:meth:`EventBuffer.stored`'s record, built once with the lookahead tokens and
        the extra keys over each block and its lookahead (the hasher's recorded keys
        where it recorded them: they are those)."""
        request, blocks, hashes, start, end, skipped, group = run
        info = self.groups[group]
        bs = info.block_size
        la = self.lookahead_tokens
        extras = request.hash_extras
        lora = extras.lora if extras is not None else None
        if skipped:
            left_out = set(skipped)
            positions: Sequence[int] = [i for i in range(start, end) if i not in left_out]
        else:
            positions = range(start, end)
        extra: list[Any] | None
        if extras is None:
            extra = [None] * len(positions)
        elif bs == self.hash_block_size and len(request.block_extra_keys) >= end:
            recorded = request.block_extra_keys
            extra = [event_extra_keys(recorded[i]) for i in positions]
        else:
            extra = [event_extra_keys(extras.block_keys(i * bs, (i + 1) * bs + la))
                     for i in positions]
        tokens = request.all_token_ids
        event = BlockStored(
            [hashes[i] for i in positions] if skipped else hashes[start:end],
            hashes[start - 1] if start else None,
            tokens[start * bs : end * bs], bs,
            lora.adapter_id if lora else None, MEDIUM_GPU, lora.name if lora else None,
            extra or None, group, info.kind, info.sliding_window,
            [list(tokens[(i + 1) * bs : (i + 1) * bs + la]) for i in positions],
        )
        self._events.append(event)
        announced = self._announced
        for k, i in enumerate(positions):
            announced[blocks[i]] = (event, k, i - start, hashes[i - 1] if i else None)

    def stored_partial(
        self, request: RequestLike, block: int, i: int, group: int, primary: bool
    ) -> None:
        super().stored_partial(request, block, i, group, primary)
        hbs = self.hash_block_size
        la = self.lookahead_tokens
        event = self._events[-1]
        assert isinstance(event, BlockStored)
        extras = request.hash_extras
        extra = event.extra_keys
        if extras is not None and len(request.block_extra_keys) <= i:
            extra = [event_extra_keys(extras.block_keys(i * hbs, (i + 1) * hbs + la))]
        ahead = [list(request.all_token_ids[(i + 1) * hbs : (i + 1) * hbs + la])]
        self._replace_last(event._replace(extra_keys=extra, lookahead_token_ids=ahead), [block])


def prefill_checkpoint_position(
    num_tokens: int, hash_block_size: int, lookahead_tokens: int
) -> int:
    """The last hash-block boundary of a prompt of ``num_tokens`` tokens that leaves at
    least ``max(1, lookahead_tokens)`` tokens after it (one to recompute the logits, and
    the lookahead its hash needs): where a Mamba group keeps the prompt's reusable state
    (vLLM 0.33's ``get_mamba_prefill_checkpoint_position`` without EAGLE's block drop).

    >>> prefill_checkpoint_position(33, 16, 0), prefill_checkpoint_position(33, 16, 1)
    (32, 32)
    >>> prefill_checkpoint_position(33, 16, 4), prefill_checkpoint_position(36, 16, 4)
    (16, 32)
    """
    return max(0, (num_tokens - max(1, lookahead_tokens)) // hash_block_size * hash_block_size)


def apply_to_managers(managers: Sequence[SingleTypeManager], lookahead_tokens: int) -> None:
    """Make freshly built managers hash-lookahead aware: each registers only blocks its
    request has hashes for (with lookahead, the blocks among the last L tokens are not
    hashed yet; vLLM 0.33's ``cache_blocks`` caps at ``len(request.block_hashes) *
    hash_block_size``): the coordinator caps the tokens it registers, and a Mamba group
    caps its own (its prompt checkpoint leaves ``max(1, L)`` tokens,
    :func:`prefill_checkpoint_position`)."""
    for m in managers:
        m.hash_lookahead_tokens = lookahead_tokens
