"""Torch tests run single-threaded: results must not depend on it (the arithmetic is
batch- and placement-invariant) and one thread is much faster for these tiny tensors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
