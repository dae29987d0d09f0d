"""The one place ``pagedkv.torch`` imports PyTorch: a missing install becomes a
:class:`~pagedkv.errors.MissingDependencyError` naming the extra to install."""

from __future__ import annotations

from pagedkv.doctor import install_command
from pagedkv.errors import MissingDependencyError

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise MissingDependencyError(
        f"pagedkv.torch needs PyTorch; install it with: {install_command('torch')}"
    ) from exc

__all__ = ["torch"]
