"""A vLLM ``Request`` as pagedkv's manager reads one (:class:`RequestView`): its own
tokens and block hashes (vLLM hashes them), and its LoRA adapter, multimodal features,
cache salt and prompt embeddings as :class:`~pagedkv.HashExtras`, so that events carry
the extra keys vLLM's would.
"""

from __future__ import annotations

from operator import attrgetter
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


def _through(name: str) -> Any:
    """A read-only property answering ``self.request.<name>`` (the read runs in C)."""
    return property(attrgetter(f"request.{name}"))


class RequestView:
    """What pagedkv reads from a vLLM request; counts and tokens are read through
    (never copied), so the view follows the request as vLLM's scheduler advances it.
    ``retention``: the pagedkv retention asked for in the request's
    ``sampling_params.extra_args["pagedkv"]`` (see :mod:`pagedkv.vllm.extras`)."""

    __slots__ = ("_extras", "_extras_done", "request", "request_id", "retention")

    # Read through in C (attrgetter): the compiled core reads these per decode call, and
    # a Python property would add a frame per read.
    all_token_ids: Any = _through("all_token_ids")
    block_hashes: list[bytes] = _through("block_hashes")
    num_tokens: int = _through("num_tokens")
    num_prompt_tokens: int = _through("num_prompt_tokens")
    num_computed_tokens: int = _through("num_computed_tokens")
    num_preemptions: int = _through("num_preemptions")

    def __init__(self, request: Any, retention: Any = None) -> None:
        self.request = request
        self.request_id: str = request.request_id
        self.retention = retention
        self._extras: HashExtras | None = None
        self._extras_done = False

    @property
    def block_extra_keys(self) -> list[list[Any] | None]:
        return []  # derived from hash_extras when an event needs them

    @property
    def hash_extras(self) -> HashExtras | None:
        if not self._extras_done:
            self._extras = hash_extras_of(self.request)
            self._extras_done = True
        return self._extras

