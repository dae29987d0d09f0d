"""A vLLM ``Request`` as pagedkv's manager reads one (:class:`RequestView`): its own
tokens and block hashes (vLLM hashes them), and its LoRA adapter, multimodal features,
cache salt and prompt embeddings as :class:`~pagedkv.HashExtras`, so that events carry
the extra keys vLLM's would.
"""

from __future__ import annotations

from typing import Any

from pagedkv.core.hash_extras import HashExtras, LoRA, MultiModalItem

__all__ = ["RequestView", "hash_extras_of"]


def hash_extras_of(request: Any) -> HashExtras | None:
    """The hash extras of a vLLM request (``None`` when it has none)."""
    lora = None
    lr = getattr(request, "lora_request", None)
    if lr is not None:
        lora = LoRA(name=str(lr.lora_name), adapter_id=int(lr.lora_int_id),
                    path=str(getattr(lr, "lora_path", "") or ""))
    items: list[MultiModalItem] = []
    for f in getattr(request, "mm_features", None) or ():
        pos = f.mm_position
        if f.identifier is not None and pos.length > 0:
            items.append(MultiModalItem(str(f.identifier), int(pos.offset), int(pos.length)))
    embeds = None
    tensor = getattr(request, "prompt_embeds", None)
    if tensor is not None:
        rows = tensor.detach().cpu().contiguous()
        embeds = tuple(rows[i].numpy().tobytes() for i in range(rows.shape[0]))
    salt = getattr(request, "cache_salt", None)
    extras = HashExtras(lora=lora, mm_items=tuple(items),
                        cache_salt=salt if isinstance(salt, str) else None,
                        prompt_embeds=embeds)
    return None if extras.is_empty else extras


class RequestView:
    """What pagedkv reads from a vLLM request; counts and tokens are read through
    (never copied), so the view follows the request as vLLM's scheduler advances it.
    ``retention``: the pagedkv retention asked for in the request's
    ``sampling_params.extra_args["pagedkv"]`` (see :mod:`pagedkv.vllm.extras`)."""

    __slots__ = ("_extras", "_extras_done", "request", "request_id", "retention")

    def __init__(self, request: Any, retention: Any = None) -> None:
        self.request = request
        self.request_id: str = request.request_id
        self.retention = retention
        self._extras: HashExtras | None = None
        self._extras_done = False

    @property
    def all_token_ids(self) -> Any:
        return self.request.all_token_ids

    @property
    def block_hashes(self) -> list[bytes]:
        return self.request.block_hashes  # type: ignore[no-any-return]

    @property
    def block_extra_keys(self) -> list[list[Any] | None]:
        return []  # derived from hash_extras when an event needs them

    @property
    def hash_extras(self) -> HashExtras | None:
        if not self._extras_done:
            self._extras = hash_extras_of(self.request)
            self._extras_done = True
        return self._extras

    @property
    def num_tokens(self) -> int:
        return self.request.num_tokens  # type: ignore[no-any-return]

    @property
    def num_prompt_tokens(self) -> int:
        return self.request.num_prompt_tokens  # type: ignore[no-any-return]

    @property
    def num_computed_tokens(self) -> int:
        return self.request.num_computed_tokens  # type: ignore[no-any-return]

    @property
    def num_preemptions(self) -> int:
        return self.request.num_preemptions  # type: ignore[no-any-return]
