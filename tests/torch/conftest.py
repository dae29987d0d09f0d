"""Torch tests run single-threaded: results must not depend on it (the arithmetic is
batch- and placement-invariant) and one thread is much faster for these tiny tensors.

They need PyTorch, which the ``test`` extra leaves out (PyPI's Linux build brings gigabytes of
CUDA packages): without it every test here is skipped; ``.ci/run`` installs the CPU build."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
