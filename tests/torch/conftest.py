"""Torch tests run single-threaded: results must not depend on it (the arithmetic is
batch- and placement-invariant) and one thread is much faster for these tiny tensors.

They need PyTorch, which the ``test`` extra leaves out (PyPI's Linux build brings gigabytes of
CUDA packages): without it every test here is skipped; ``.ci/run`` installs the CPU build."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

# Without PyTorch, `import torch` would find this very folder (tests/ is on sys.path) as a
# namespace package: look for the real one without importing anything.
_spec = importlib.util.find_spec("torch")
if _spec is None or _spec.origin is None:
    pytest.skip("PyTorch is not installed (the CPU build is enough; .ci/run installs it)",
                allow_module_level=True)

import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
