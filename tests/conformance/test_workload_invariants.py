"""The differential suite's workload, run without vLLM: pagedkv against itself on every
layout, with every structure's invariants checked after every operation (deferred frees,
truncated hits, the admission gate, blocks to zero, sub-block hits and their copies
included). Two managers fed the same operations must also answer identically.
"""

from __future__ import annotations

import pytest
from conformance.layouts import LAYOUTS, Layout
from conformance.model import Snapshot
from conformance.pagedkv_side import PagedSide
from conformance.workload import run_seed


class CheckedSide(PagedSide):
    """A pagedkv side whose manager checks its invariants before every comparison."""

    def snapshot(self, with_tables: bool = True) -> Snapshot:
        self.mgr.check_invariants()
        return super().snapshot(with_tables)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.name for x in LAYOUTS])
def test_workload_keeps_invariants(layout: Layout) -> None:
    for seed in range(2):
        res = run_seed(layout, seed, 150, CheckedSide(layout), CheckedSide(layout))
        assert res.divergence is None, res.divergence


def test_sub_block_layout_exercises_copies() -> None:
    """The finer-hash layout really produces sub-block hits and copies (so the suite
    compares non-empty copy plans)."""
    layout = next(x for x in LAYOUTS if x.prefix_match_unit)
    copies = 0

    class Counting(CheckedSide):
        def take_copies(self) -> list[tuple[int, int]]:
            nonlocal copies
            out = super().take_copies()
            copies += len(out)
            return out

    for seed in range(2):
        assert run_seed(layout, seed, 200, Counting(layout), Counting(layout)).divergence is None
    assert copies > 0
