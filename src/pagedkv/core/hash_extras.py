"""What makes equal tokens mean different things, as block-hash *extra keys*: a LoRA
adapter, multimodal items, a cache salt, prompt embeddings (:class:`HashExtras`), their
per-block keys, their encodings for hashing (cached) and for events.

Extra keys (one list per block, ``None`` when empty), in this order, as vLLM 0.33 builds
them: ``["lora", lora_name, lora_path]``; per multimodal item overlapping the block
``["mm", identifier, item_offset - block_start]``; on the first block only and only for a
non-empty salt ``["cache_salt", salt]``; for prompt embeddings ``["prompt_embeds",
sha256(block's embedding bytes)]`` (:mod:`pagedkv.core.hashing` hashes them with the
tokens).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple, NoReturn

from pagedkv.checks import check_text
from pagedkv.core.cbor import canonical_cbor
from pagedkv.errors import InvalidArgumentError

__all__ = [
    "HashExtras",
    "LoRA",
    "MultiModalItem",
    "event_extra_keys",
    "keys_cbor",
    "lora_keys_cbor",
]


class LoRA(NamedTuple):
    """A LoRA adapter: ``name`` and ``path`` key the hash, ``adapter_id`` goes into events
    (with ``name``). ``path`` is where the adapter's weights come from (vLLM's
    ``lora_path``): two adapters of one name but different paths never share cached KV."""

    name: str
    adapter_id: int
    path: str = ""


class MultiModalItem(NamedTuple):
    """A multimodal input (image, audio…) occupying prompt tokens
    ``[offset, offset + length)``; ``identifier`` is the hash of its content."""

    identifier: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class HashExtras:
    """What makes equal tokens mean different things: a LoRA adapter, multimodal items,
    a cache salt, prompt embeddings (each checked at construction: InvalidArgumentError
    names the field; ``mm_items`` and ``prompt_embeds`` given as other sequences become
    tuples). Part of every block hash (as *extra keys*, module docstring) and of every
    stored event. A request without any has ``None`` instead.

    >>> extras = HashExtras(lora=LoRA("sql", 1, "/adapters/sql"), cache_salt="tenant-7")
    >>> extras.block_keys(0, 4)
    [['lora', 'sql', '/adapters/sql'], ['cache_salt', 'tenant-7']]
    >>> extras.block_keys(4, 8)
    [['lora', 'sql', '/adapters/sql']]
    >>> HashExtras(cache_salt="").block_keys(0, 4) is None   # an empty salt is no salt
    True
    >>> HashExtras(mm_items=[MultiModalItem("img", 6, 4)]).block_keys(4, 8)
    [['mm', 'img', 2]]
    >>> HashExtras().is_empty
    True
    """

    lora: LoRA | None = None
    mm_items: tuple[MultiModalItem, ...] = ()
    cache_salt: str | None = None
    prompt_embeds: tuple[bytes, ...] | None = None

    def __new__(
        cls,
        *,
        lora: LoRA | None = None,
        mm_items: Sequence[MultiModalItem] = (),
        cache_salt: str | None = None,
        prompt_embeds: Sequence[bytes] | None = None,
    ) -> HashExtras:
        # Built in __new__ (no __init__): extras that set nothing are one shared instance
        # (the class is immutable), returned without a field set.
        if (lora is None and cache_salt is None and prompt_embeds is None
                and type(mm_items) is tuple and not mm_items and cls is HashExtras
                and _EMPTY):
            return _EMPTY[0]
        # (Each test starts with the exact-type check that the common value passes; a
        # frozen dataclass's fields are set through the slots' own setters.)
        if type(mm_items) is not tuple:
            if isinstance(mm_items, (str, bytes)):
                _bad("mm_items", mm_items, "a sequence of MultiModalItem")
            if not isinstance(mm_items, tuple):
                mm_items = tuple(mm_items)
        if prompt_embeds is not None:
            if isinstance(prompt_embeds, (str, bytes)):
                _bad("prompt_embeds", prompt_embeds, "a sequence of bytes, one per prompt token")
            if not isinstance(prompt_embeds, tuple):
                prompt_embeds = tuple(prompt_embeds)
            for e in prompt_embeds:
                if type(e) is not bytes:
                    _bad("prompt_embeds", e, "bytes (one token's embedding)")
        if lora is not None and (
                not isinstance(lora, LoRA) or type(lora.name) is not str
                or type(lora.adapter_id) is not int):
            _bad("lora", lora, 'LoRA(name, adapter_id), e.g. LoRA("sql-adapter", 1)')
        for item in mm_items:
            if not isinstance(item, MultiModalItem) or type(item.identifier) is not str or (
                    type(item.offset) is not int or type(item.length) is not int
                    or item.offset < 0 or item.length <= 0):
                _bad("mm_items", item, "MultiModalItem(identifier: str, offset >= 0, length > 0)")
        if cache_salt is not None and type(cache_salt) is not str:
            _bad("cache_salt", cache_salt, "a str (or None)")
        if cache_salt and not (cache_salt.isascii() and "\x00" not in cache_salt):
            check_text("HashExtras.cache_salt", cache_salt)  # a lone surrogate cannot be hashed
        self = object.__new__(cls)
        _set_lora(self, lora)
        _set_mm_items(self, mm_items)
        _set_cache_salt(self, cache_salt)
        _set_prompt_embeds(self, prompt_embeds)
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled and copied as its fields (``__new__`` takes them by keyword)."""
        return _rebuild, (type(self), self.lora, self.mm_items, self.cache_salt,
                          self.prompt_embeds)

    @property
    def is_empty(self) -> bool:
        """True when nothing is set (such extras change no hash)."""
        return (self.lora is None and not self.mm_items and not self.cache_salt
                and self.prompt_embeds is None)

    def block_keys(self, start: int, end: int) -> list[Any] | None:
        """Extra hash keys of the block of tokens ``[start, end)``; ``None`` when it has
        none. O(number of multimodal items + embedding bytes of the block)."""
        keys: list[Any] = []
        if self.lora is not None:
            keys.append(["lora", self.lora.name, self.lora.path])
        for item in self.mm_items:
            if item.offset < end and item.offset + item.length > start:
                keys.append(["mm", item.identifier, item.offset - start])
        if self.cache_salt and start == 0:
            keys.append(["cache_salt", self.cache_salt])
        embeds = self.prompt_embeds
        if embeds is not None and start < len(embeds):
            digest = hashlib.sha256(b"".join(embeds[start:end])).digest()
            keys.append(["prompt_embeds", digest])
        return keys or None


# The slots' setters (a frozen dataclass refuses plain assignment).
_set_lora = HashExtras.__dict__["lora"].__set__
_set_mm_items = HashExtras.__dict__["mm_items"].__set__
_set_cache_salt = HashExtras.__dict__["cache_salt"].__set__
_set_prompt_embeds = HashExtras.__dict__["prompt_embeds"].__set__


def _rebuild(cls: type[HashExtras], lora: LoRA | None, mm_items: tuple[MultiModalItem, ...],
             cache_salt: str | None, prompt_embeds: tuple[bytes, ...] | None) -> HashExtras:
    """HashExtras.__reduce__'s constructor."""
    return cls(lora=lora, mm_items=mm_items, cache_salt=cache_salt,
               prompt_embeds=prompt_embeds)


#: The one instance of extras that set nothing (filled once the class exists).
_EMPTY: list[HashExtras] = []
_EMPTY.append(HashExtras())


def _bad(field: str, value: object, expected: str) -> NoReturn:
    raise InvalidArgumentError(f"HashExtras.{field}: expected {expected}, got {value!r}")


def event_extra_keys(keys: list[Any] | None) -> list[Any] | None:
    """One block's extra keys as KV-cache events carry them (vLLM's ``to_event_extra_keys``):
    untagged, a multimodal key as ``[identifier, offset]`` and every other key as its bare
    value (LoRA name, salt, embeddings digest); ``None`` stays ``None``.

    >>> event_extra_keys([["lora", "sql", "/a"], ["mm", "img", 2], ["cache_salt", "t"]])
    ['sql', ['img', 2], 't']
    """
    if keys is None:
        return None
    return [key[1:] if key[0] == "mm" else key[1] for key in keys]


@lru_cache(maxsize=256)
def lora_keys_cbor(name: str, path: str) -> bytes:
    """The encoded extra keys of a block whose only key is its LoRA adapter."""
    return canonical_cbor([["lora", name, path]])


_KEYS_CACHE_SIZE = 4096
_keys_cache: dict[tuple[tuple[Any, ...], ...], bytes] = {}


def keys_cbor(keys: list[Any]) -> bytes:
    """``canonical_cbor(keys)`` for one block's extra keys whose items are str, int
    (never bool: HashExtras rejects it) or bytes, cached (a salted first block and a
    multimodal item's blocks recur across requests). Equal tuples of such items always
    encode equally. Thread-safe in the memo's sense: a race only loses entries."""
    key = tuple(map(tuple, keys))
    encoded = _keys_cache.get(key)
    if encoded is None:
        encoded = canonical_cbor(keys)
        if len(_keys_cache) >= _KEYS_CACHE_SIZE:
            _keys_cache.clear()
        _keys_cache[key] = encoded
    return encoded
