"""Typed, error-reporting access to the fields of a model's ``config.json``.

A :class:`ConfigFields` reads one (sub-)dictionary of a config. Every failure is an
:class:`~pagedkv.errors.InputFileError` that names the file, the key and the problem; every
default it applies for an absent key is remembered in :attr:`ConfigFields.notes`, so a plan
can say which values were assumed rather than read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pagedkv.errors import InputFileError

__all__ = ["ConfigFields"]

_MISSING: Any = object()


class ConfigFields:
    """Read fields of one config dictionary.

    ``prefix`` is how the dictionary is reached from the file's top level (``"text_config."``
    for a nested text model) and appears in error messages. ``fallback`` is consulted for a
    key the dictionary lacks (a nested text config inherits ``torch_dtype`` from the outer
    one). ``defaults`` are the values the model family's reference implementation applies
    when a key is absent (e.g. the defaults of a nested sub-config, which ``save_pretrained``
    omits from the file).
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        source: str,
        model_type: str,
        prefix: str = "",
        fallback: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.data = data
        self.source = source
        self.model_type = model_type
        self.prefix = prefix
        self.fallback = fallback or {}
        self.defaults = defaults or {}
        self.notes: list[str] = []

    # -- errors ----------------------------------------------------------------------------

    def error(self, key: str, problem: str) -> InputFileError:
        """An :class:`InputFileError` about ``key`` of this dictionary."""
        return InputFileError(self.source, problem, key=self.prefix + key)

    # -- raw access --------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        """Whether ``key`` is present with a non-null value (here or in the fallback)."""
        return self.raw(key) is not None

    def raw(self, key: str) -> Any:
        """The value of ``key`` (here, else in the fallback), or ``None`` if absent or null."""
        if key in self.data:
            return self.data[key]
        return self.fallback.get(key)

    def _lookup(self, key: str, default: Any, describe: str) -> Any:
        value = self.raw(key)
        if value is not None:
            return value
        if key in self.defaults:
            value = self.defaults[key]
        elif default is not _MISSING:
            value = default
        else:
            raise self.error(
                key, f"missing; model_type {self.model_type!r} needs {describe} here"
            )
        if value is not None:
            self.notes.append(f"{self.prefix}{key} absent: using {value!r}")
        return value

    # -- typed access ------------------------------------------------------------------------

    def get_int(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        """The integer at ``key`` (at least ``minimum``), or the default.

        Raises:
            InputFileError: absent with no default, not an integer, or below ``minimum``.
        """
        value = self._lookup(key, default, "an integer")
        return self._check_int(key, value, minimum)

    def opt_int(self, key: str, *, minimum: int = 1) -> int | None:
        """The integer at ``key``, or ``None`` when the key is absent or null."""
        value = self.raw(key)
        if value is None:
            value = self.defaults.get(key)
        if value is None:
            return None
        return self._check_int(key, value, minimum)

    def _check_int(self, key: str, value: Any, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self.error(key, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {value!r}")
        return int(value)

    def get_bool(self, key: str, default: bool) -> bool:
        """The boolean at ``key``, or ``default`` when absent or null."""
        value = self.raw(key)
        if value is None:
            return bool(self.defaults.get(key, default))
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        """The string at ``key``, or the default."""
        value = self._lookup(key, default, "a string")
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        return value

    def str_list(self, key: str, *, length: int | None = None) -> list[str] | None:
        """The list of strings at ``key`` (exactly ``length`` long when given), or ``None``
        if absent."""
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, Sequence) or isinstance(value, str) or not all(
            isinstance(item, str) for item in value
        ):
            raise self.error(key, f"expected a list of strings, got {value!r}")
        if length is not None and len(value) != length:
            raise self.error(
                key, f"has {len(value)} entries but num_hidden_layers is {length}"
            )
        return list(value)

    def int_list(self, key: str, *, length: int) -> list[int] | None:
        """The list of integers at ``key`` (exactly ``length`` long), or ``None`` if absent."""
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, Sequence) or isinstance(value, str) or not all(
            isinstance(item, int) and not isinstance(item, bool) for item in value
        ):
            raise self.error(key, f"expected a list of integers, got {value!r}")
        if len(value) != length:
            raise self.error(
                key, f"has {len(value)} entries but num_hidden_layers is {length}"
            )
        return list(value)
