"""The request: what the manager reads from one (:class:`RequestLike`) and an
engine-agnostic class that has all of it (:class:`Request`).

A request carries its tokens, its chained block hashes (kept up to date incrementally) and
its :class:`~pagedkv.core.hashing.HashExtras` (LoRA, multimodal items, cache salt, prompt
embeddings). An engine may use :class:`Request` directly or adapt its own request type to
the :class:`RequestLike` attributes.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from pagedkv.core.hashing import BlockHasher, HashExtras
from pagedkv.errors import InvalidArgumentError

__all__ = ["Request", "RequestLike", "token_ids_problem"]

_NEVER = sys.maxsize  # Request._hash_at without a hasher


class RequestLike(Protocol):
    """What the manager (and the pool, when it registers blocks) reads from a request.

    ``block_hashes[i]`` is the chained hash of tokens ``[0, (i + 1) * hash_block_size)``;
    ``block_extra_keys[i]`` the extra keys that went into it (an empty list when
    ``hash_extras`` is ``None``, or when the keys were not recorded: then they are derived
    from ``hash_extras`` when an event needs them).
    """

    @property
    def request_id(self) -> str: ...
    @property
    def all_token_ids(self) -> list[int]: ...
    @property
    def block_hashes(self) -> list[bytes]: ...
    @property
    def block_extra_keys(self) -> list[list[Any] | None]: ...
    @property
    def hash_extras(self) -> HashExtras | None: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def num_preemptions(self) -> int: ...


class Request:
    """One inference request as the KV-cache manager sees it.

    ``num_computed_tokens`` is owned by the engine: it advances it after each step (tokens
    whose KV is now in the cache), and the manager reads it in ``allocate_slots``.

    Block hashes: with a ``hasher``, the hash of every full block of ``all_token_ids`` is
    computed at construction and on :meth:`append_output_tokens`, each block once. With
    caller-supplied ``block_hashes`` (e.g. a trace that carries them), those are used as
    given and the hasher, if any, continues the chain past them.

    >>> r = Request("r1", [1, 2, 3, 4, 5], hasher=BlockHasher(4))
    >>> len(r.block_hashes), r.num_tokens
    (1, 5)
    >>> r.append_output_tokens([6, 7, 8])
    >>> len(r.block_hashes)
    2
    """

    __slots__ = (
        "_hash_at",
        "_hasher",
        "_owned_tokens",
        "all_token_ids",
        "block_extra_keys",
        "block_hashes",
        "hash_extras",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "request_id",
        "retention",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        hasher: BlockHasher | None = None,
        block_hashes: Sequence[bytes] | None = None,
        hash_extras: HashExtras | None = None,
        retention: Any = None,
    ) -> None:
        hashes: list[bytes] = []
        keys: list[list[Any] | None] = []
        # The compiled core checks, copies and hashes the prompt in one call (None: not
        # covered, nothing done: the checked path below).
        tokens = None
        hash_at = _NEVER  # (a hasher's checked path below sets its own)
        if hasher is not None and block_hashes is None and (start := hasher._start) is not None:
            tokens = start(hashes, prompt_token_ids, hasher.block_size, hasher.seed,
                           hash_extras, keys)
            hash_at = (len(hashes) + 1) * hasher.block_size
        hashed = tokens is not None
        if tokens is None:
            if not prompt_token_ids:
                raise InvalidArgumentError(f"request {request_id!r} has an empty prompt")
            why = token_ids_problem(prompt_token_ids)
            if why is not None:
                raise InvalidArgumentError(f"request {request_id!r}: {why}")
            embeds = hash_extras.prompt_embeds if hash_extras is not None else None
            if embeds is not None and len(embeds) != len(prompt_token_ids):
                raise InvalidArgumentError(
                    f"request {request_id!r}: {len(embeds)} prompt embeddings for "
                    f"{len(prompt_token_ids)} prompt tokens; give one per token"
                )
            tokens = list(prompt_token_ids)
        # (Keys recorded by the kernel: extras that set something.)
        if hash_extras is not None and not keys and hash_extras.is_empty:
            hash_extras = None
        self.request_id = request_id
        self.all_token_ids: list[int] = tokens
        #: _owned_tokens: len(all_token_ids) as the facade left it: a list that grew behind
        #: append_output_tokens (unhashed tokens) is refused by allocate_slots.
        self.num_prompt_tokens = self._owned_tokens = len(tokens)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.hash_extras = hash_extras
        #: Retention asked for this request's blocks once freed (managers with retention).
        self.retention = retention
        self._hasher = hasher
        self.block_hashes: list[bytes] = list(block_hashes) if block_hashes is not None else hashes
        #: Extra keys of each hashed block, recorded by the hasher (with ``hash_extras``).
        self.block_extra_keys: list[list[Any] | None] = keys
        #: The token count at which a block next becomes full (no hasher: never): what
        #: append_output_tokens compares with.
        self._hash_at = hash_at
        if hasher is not None and not hashed:
            self._extend_hashes()

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    def append_output_tokens(self, tokens: int | Iterable[int]) -> None:
        """Append generated token(s); hashes every block that became full. O(new tokens).

        Raises:
            InvalidArgumentError: a token id that is not an int in ``0 .. 2**64 - 1``;
                nothing was appended.
        """
        token_ids = self.all_token_ids
        if type(tokens) is int and 0 <= tokens < 1 << 64:
            token_ids.append(tokens)
        else:
            new = [tokens] if isinstance(tokens, int) else list(tokens)
            why = token_ids_problem(new)
            if why is not None:
                raise InvalidArgumentError(f"request {self.request_id!r}: output {why}")
            token_ids.extend(new)
        self._owned_tokens = num_tokens = len(token_ids)
        if num_tokens >= self._hash_at:
            self._extend_hashes()

    def set_hasher(self, hasher: BlockHasher) -> None:
        """Attach a hasher to a request built without one and hash its full blocks now."""
        self._hasher = hasher
        self._extend_hashes()

    def _extend_hashes(self) -> None:
        """Hash every full block not hashed yet; then the next block's end is
        ``_hash_at``."""
        hasher = self._hasher
        assert hasher is not None
        extras = self.hash_extras
        hashes = self.block_hashes
        keys = self.block_extra_keys
        # Caller-supplied hashes: their keys were never recorded (the events derive them).
        keys_out = keys if extras is not None and len(keys) == len(hashes) else None
        # The compiled core hashes the new blocks in one call (False: not covered,
        # nothing done: the hasher's path).
        step = hasher._step
        if step is None or not step(hashes, self.all_token_ids, hasher.block_size,
                                    hasher.seed, extras, keys_out):
            if extras is None:
                hasher.extend(hashes, self.all_token_ids)
            else:
                hasher.extend(hashes, self.all_token_ids, extras=extras, keys_out=keys_out)
        self._hash_at = (len(hashes) + 1) * hasher.block_size

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens})"
        )


def token_ids_problem(token_ids: Sequence[Any]) -> str | None:
    """Why ``token_ids`` are not token ids (ints in ``0 .. 2**64 - 1``), or None. O(n),
    in C (one ``array`` build) when they are.

    >>> token_ids_problem([1, 2, 3]) is None
    True
    >>> token_ids_problem([1, 2.5])
    'token 1 is 2.5; token ids are non-negative ints below 2**64'
    """
    if isinstance(token_ids, (bytes, bytearray, memoryview, str)):
        return (f"the token ids are {type(token_ids).__name__}, not a sequence of ints; "
                "give a list of token ids")
    try:
        array("Q", token_ids)
    except (TypeError, OverflowError, ValueError):
        for i, t in enumerate(token_ids):
            if type(t) is not int or not 0 <= t < 1 << 64:
                return f"token {i} is {t!r}; token ids are non-negative ints below 2**64"
    return None
