"""Torch tests run single-threaded: results must not depend on it (the arithmetic is
batch- and placement-invariant) and one thread is much faster for these tiny tensors.

They need PyTorch, which the ``test`` extra leaves out (PyPI's Linux build brings gigabytes of
CUDA packages): without it no test here is collected; ``.ci/run`` installs the CPU build."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

# Without PyTorch, `import torch` would find this very folder (tests/ is on sys.path) as a
# namespace package: look for the real one without importing anything. Absent, no test
# module here is collected (each imports torch); tests/conftest.py says so in the header.
_spec = importlib.util.find_spec("torch")
HAVE_TORCH = _spec is not None and _spec.origin is not None

if not HAVE_TORCH:
    collect_ignore_glob = ["*.py"]
else:
    import torch

    @pytest.fixture(autouse=True)
    def _one_thread() -> Iterator[None]:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(before)
