"""Every exception pagedkv raises, in one tree.

::

    PagedKVError                  base of everything below
    ├── InvalidArgumentError      a caller passed a value the call cannot accept
    │   │                         (also a ValueError)
    │   ├── DuplicateRequestError a request id already used by another live request
    │   └── InvalidHitError       a prefix-cache hit (``ComputedBlocks``) from another
    │                             manager or request, or no longer valid
    ├── UnknownRequestError       a request id the manager does not track
    │                             (also a KeyError)
    ├── ConfigError               a configuration that cannot be met (also a ValueError),
    │                             e.g. a pool too large for this machine's memory
    │   ├── SpecMergeError        two layer specs that cannot share a KV-cache group
    │   ├── InsufficientMemoryError
    │   │                         the memory budget cannot hold one request of
    │   │                         ``max_model_len``; says what is needed, what is there,
    │   │                         and the largest length that fits
    │   └── UnsupportedModelError a model config whose family or fields are not understood
    ├── PinBudgetError            a pin that would pass the pin budget (retention);
    │                             nothing was pinned (also a ValueError)
    ├── InputFileError            a malformed input file; names file, line and key
    │                             (also a ValueError)
    └── MissingDependencyError    an optional extra is not installed (also an ImportError)

Running out of free blocks is **not** an exception: ``allocate_slots`` returns ``None``
and leaves every piece of state as it was. Every exception a manager raises leaves its
state as it was too (``debug_state()`` is identical before and after).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DuplicateRequestError",
    "InputFileError",
    "InsufficientMemoryError",
    "InvalidArgumentError",
    "InvalidHitError",
    "MissingDependencyError",
    "PagedKVError",
    "PinBudgetError",
    "SpecMergeError",
    "UnknownRequestError",
    "UnsupportedModelError",
]


class PagedKVError(Exception):
    """Base class of every error raised by pagedkv."""


class InvalidArgumentError(PagedKVError, ValueError):
    """A caller passed an argument the call cannot accept; the message says which and why."""


class DuplicateRequestError(InvalidArgumentError):
    """A request id that another live request (one holding blocks) already uses. Ids must
    be unique among live requests; a finished request's id is free again once freed."""


class InvalidHitError(InvalidArgumentError):
    """A ``ComputedBlocks`` hit that ``allocate_slots`` cannot adopt: issued by another
    manager or for another request, altered, or stale (its blocks were evicted or now hold
    other content). Look the request up again with ``get_computed_blocks``."""


class UnknownRequestError(PagedKVError, KeyError):
    """A request id that the manager does not track (never allocated, or already freed)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class ConfigError(PagedKVError, ValueError):
    """A configuration that cannot be met."""


class SpecMergeError(ConfigError):
    """Two layer specs that were asked to share one KV-cache group but differ."""


class InsufficientMemoryError(ConfigError):
    """The KV-cache memory cannot hold even one request of ``max_model_len`` tokens.

    Attributes give the figures the message states.
    """

    def __init__(
        self,
        message: str,
        *,
        needed_bytes: int,
        available_bytes: int,
        max_model_len_that_fits: int,
    ) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.max_model_len_that_fits = max_model_len_that_fits


class UnsupportedModelError(ConfigError):
    """A model config whose ``model_type`` or required fields pagedkv does not understand."""


class PinBudgetError(PagedKVError, ValueError):
    """A pin refused because the pinned prefix blocks would pass the pin budget
    (``RetentionConfig.pin_budget_fraction`` of the pool); nothing was pinned."""


class InputFileError(PagedKVError, ValueError):
    """A malformed input file (trace, config, layer-spec file).

    ``path``, ``line`` (1-based, or ``None`` for whole-file problems) and ``key`` name the
    place; the message also says what was wrong there.
    """

    def __init__(
        self, path: str, problem: str, *, line: int | None = None, key: str | None = None
    ) -> None:
        where = path if line is None else f"{path}:{line}"
        if key is not None:
            where += f": key {key!r}"
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line
        self.key = key
        self.problem = problem


class MissingDependencyError(PagedKVError, ImportError):
    """An optional extra is needed for this feature; the message names the pip command."""


def require(module: str, extra: str, feature: str) -> object:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra to install."""
    import importlib

    from pagedkv.doctor import install_command

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{feature} needs the optional package {module!r}; "
            f"install it with: {install_command(extra)}"
        ) from exc
