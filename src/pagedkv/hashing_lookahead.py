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

from pagedkv.errors import InvalidArgumentError
from pagedkv.events.recorder import EventBuffer, GroupInfo
from pagedkv.events.records import BlockStored
from pagedkv.hashing import BlockHasher, HashExtras, event_extra_keys
from pagedkv.managers.base import SingleTypeManager
from pagedkv.managers.mamba import MambaAlignManager
from pagedkv.request import RequestLike

__all__ = [
    "LookaheadBlockHasher",
    "LookaheadEventBuffer",
    "apply_to_managers",
    "prefill_checkpoint_position",
]


class LookaheadBlockHasher(BlockHasher):
    """A :class:`pagedkv.BlockHasher` whose block hashes also cover the
    ``lookahead_tokens`` (L >= 1) tokens after each block (module docstring).

    Same constructor as :class:`~pagedkv.BlockHasher` plus ``lookahead_tokens``. The memo
    is not used (every block is hashed on its own, via :meth:`hash_block`).

    >>> h = LookaheadBlockHasher(2, lookahead_tokens=1)
    >>> out: list[bytes] = []
    >>> h.extend(out, [7, 8, 9, 10, 11])    # blocks [0, 2) and [2, 4); [4, 6) is not full
    >>> out == [h.hash_block(h.seed, [7, 8], [None, 9]),
    ...         h.hash_block(out[0], [9, 10], [None, 11])]
    True
    """

    __slots__ = ("lookahead_tokens",)

    def __init__(
        self,
        block_size: int,
        *,
        lookahead_tokens: int,
        algo: str = "sha256_cbor",
        secret_seed: bytes | None = None,
        memo_blocks: int = 0,
    ) -> None:
        if type(lookahead_tokens) is not int or lookahead_tokens < 1:
            raise InvalidArgumentError(
                f"lookahead_tokens must be an int >= 1, got {lookahead_tokens!r} "
                "(use BlockHasher for no lookahead)"
            )
        super().__init__(block_size, algo=algo, secret_seed=secret_seed, memo_blocks=memo_blocks)
        self.lookahead_tokens = lookahead_tokens

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
        parent = hashes[-1] if hashes else self.seed
        while start + bs + la <= len(token_ids):
            end = start + bs
            keys = None if extras is None else extras.block_keys(start, end + la)
            ahead = token_ids[end : end + la]
            parent = self.hash_block(parent, token_ids[start:end], [keys, *ahead])
            hashes.append(parent)
            if keys_out is not None and extras is not None:
                keys_out.append(keys)
            start = end


class LookaheadEventBuffer(EventBuffer):
    """An :class:`~pagedkv.events.recorder.EventBuffer` whose stored records carry
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

    def stored(
        self,
        request: RequestLike,
        blocks: Sequence[int],
        hashes: list[bytes],
        start: int,
        end: int,
        skipped: Sequence[int],
        group: int,
    ) -> None:
        super().stored(request, blocks, hashes, start, end, skipped, group)
        bs = self.groups[group].block_size
        la = self.lookahead_tokens
        left_out = set(skipped)
        positions = [i for i in range(start, end) if i not in left_out]
        tokens = request.all_token_ids
        ahead = [list(tokens[(i + 1) * bs : (i + 1) * bs + la]) for i in positions]
        event = self._events[-1]
        assert isinstance(event, BlockStored)
        extras = request.hash_extras
        extra = event.extra_keys
        if extras is not None and not (
                bs == self.hash_block_size and len(request.block_extra_keys) >= end):
            # Not the keys the hasher recorded: derive them over block + lookahead.
            extra = [event_extra_keys(extras.block_keys(i * bs, (i + 1) * bs + la))
                     for i in positions] or None
        self._replace_last(event._replace(extra_keys=extra, lookahead_token_ids=ahead),
                           [blocks[i] for i in positions])

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


_CAPPED: dict[type[SingleTypeManager], type[SingleTypeManager]] = {}


def _capped_class(base: type[SingleTypeManager]) -> type[SingleTypeManager]:
    """(Built once per class.) ``base`` whose :meth:`cache_blocks` registers only blocks
    the request has hashes for (with lookahead, the blocks among the last L tokens are not
    hashed yet), as vLLM 0.33's ``cache_blocks`` caps at
    ``len(request.block_hashes) * hash_block_size``."""

    def cache_blocks(
        self: SingleTypeManager, request: RequestLike, request_id: str, num_tokens: int
    ) -> None:
        hashed = len(request.block_hashes) * self.pool.hash_block_size
        base.cache_blocks(self, request, request_id, min(num_tokens, hashed))

    capped = _CAPPED.get(base)
    if capped is None:
        capped = type(f"Lookahead{base.__name__}", (base,), {"cache_blocks": cache_blocks})
        _CAPPED[base] = capped
    return capped


def apply_to_managers(managers: Sequence[SingleTypeManager], lookahead_tokens: int) -> None:
    """Make freshly built managers hash-lookahead aware: each caps what it registers at
    its request's hashed tokens (a Mamba group does so already, and its prompt checkpoint
    leaves ``max(1, L)`` tokens, :func:`prefill_checkpoint_position`)."""
    for m in managers:
        if isinstance(m, MambaAlignManager):
            m.hash_lookahead_tokens = lookahead_tokens
        else:
            m.__class__ = _capped_class(type(m))
