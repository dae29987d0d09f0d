"""An engine-agnostic request: its tokens, its block hashes (kept up to date incrementally)
and what makes equal tokens mean different things (LoRA, multimodal items, cache salt,
prompt embeddings).

An engine may use this class directly or adapt its own request type to the same attributes
(see :class:`pagedkv.manager.RequestLike`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagedkv.errors import InvalidArgumentError
from pagedkv.hashing import BlockHasher, LoRA, MultiModalItem

__all__ = ["Request"]


class Request:
    """One inference request as the KV-cache manager sees it.

    ``num_computed_tokens`` is owned by the engine: it advances it after each step (tokens
    whose KV is now in the cache), and the manager reads it in ``allocate_slots``.

    Block hashes: with a ``hasher``, the hash of every full block of ``all_token_ids`` is
    computed at construction and on :meth:`append_output_tokens`, each block once. With
    caller-supplied ``block_hashes`` (e.g. a trace that carries them), those are used as
    given and the hasher, if any, continues the chain past them.
    """

    __slots__ = (
        "_hasher",
        "all_token_ids",
        "block_hashes",
        "cache_salt",
        "lora",
        "mm_items",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "prompt_embeds",
        "request_id",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        hasher: BlockHasher | None = None,
        block_hashes: Sequence[bytes] | None = None,
        lora: LoRA | None = None,
        mm_items: Sequence[MultiModalItem] = (),
        cache_salt: str | None = None,
        prompt_embeds: Sequence[bytes] | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise InvalidArgumentError(f"request {request_id!r} has an empty prompt")
        if prompt_embeds is not None and len(prompt_embeds) != len(prompt_token_ids):
            raise InvalidArgumentError(
                f"request {request_id!r}: {len(prompt_embeds)} prompt embeddings for "
                f"{len(prompt_token_ids)} prompt tokens; give one per token"
            )
        self.request_id = request_id
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.all_token_ids)
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.lora = lora
        self.mm_items = tuple(mm_items)
        self.cache_salt = cache_salt
        self.prompt_embeds = prompt_embeds
        self._hasher = hasher
        self.block_hashes: list[bytes] = list(block_hashes) if block_hashes is not None else []
        if hasher is not None:
            self._extend_hashes()

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    def append_output_tokens(self, tokens: int | Iterable[int]) -> None:
        """Append generated token(s); hashes every block that became full. O(new tokens)."""
        if isinstance(tokens, int):
            self.all_token_ids.append(tokens)
        else:
            self.all_token_ids.extend(tokens)
        hasher = self._hasher
        if hasher is not None and len(self.all_token_ids) >= (
            len(self.block_hashes) + 1
        ) * hasher.block_size:
            self._extend_hashes()

    def set_hasher(self, hasher: BlockHasher) -> None:
        """Attach a hasher to a request built without one and hash its full blocks now."""
        self._hasher = hasher
        self._extend_hashes()

    def _extend_hashes(self) -> None:
        assert self._hasher is not None
        self._hasher.extend(
            self.block_hashes,
            self.all_token_ids,
            lora=self.lora,
            mm_items=self.mm_items,
            cache_salt=self.cache_salt,
            prompt_embeds=self.prompt_embeds,
        )

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens})"
        )
