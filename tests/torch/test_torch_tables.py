"""Block tables and slot mappings: worked cases and a per-token reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import InvalidArgumentError
from pagedkv.torch import Placement, ShuffledPlacement, build_batch_tables


def test_worked_cases_from_the_docstring() -> None:
    t = build_batch_tables([([7, 3, 9],), ([7, 3, 9],)], [5, 8], [3, 1], block_sizes=[4],
                           num_table_blocks=[5])
    assert t.slot_mappings[0] is not None
    assert t.slot_mappings[0].tolist() == [13, 14, 15, 36]
    assert t.positions.tolist() == [5, 6, 7, 8]
    assert t.token_to_request.tolist() == [0, 0, 0, 1]
    assert t.query_start_loc.tolist() == [0, 3, 4] and t.seq_lens.tolist() == [8, 9]
    assert t.block_tables[0].tolist() == [[7, 3, 9, 0, 0], [7, 3, 9, 0, 0]]
    assert t.block_tables[0].dtype == torch.int32 and t.slot_mappings[0].dtype == torch.int64


def test_state_groups_get_no_slot_mapping_and_null_slots_are_refused() -> None:
    t = build_batch_tables([([1, 2], [5])], [0], [6], block_sizes=[4, 4],
                           num_table_blocks=[4, 4], token_slot_groups=[True, False])
    assert t.slot_mappings[1] is None
    with pytest.raises(InvalidArgumentError, match="has no block in its table"):
        build_batch_tables([([0, 2],)], [0], [6], block_sizes=[4], num_table_blocks=[4])
    with pytest.raises(InvalidArgumentError, match="columns"):
        build_batch_tables([([1, 2, 3],)], [0], [9], block_sizes=[4], num_table_blocks=[2])


def test_shuffled_placement_is_a_permutation_fixing_the_null_block() -> None:
    p = ShuffledPlacement(num_blocks=100, seed=3)
    ids = p.physical(torch.arange(100))
    assert ids[0] == 0 and sorted(ids.tolist()) == list(range(100))
    assert ids.tolist() != list(range(100))
    t = build_batch_tables([([4, 9],)], [0], [5], block_sizes=[4], num_table_blocks=[3],
                           placement=p)
    assert t.block_tables[0].tolist() == [[int(ids[4]), int(ids[9]), 0]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 12)), min_size=1, max_size=6),
       st.sampled_from([1, 4, 8]), st.integers(0, 5))
def test_matches_a_per_token_reference(reqs: list[tuple[int, int]], bs: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    tables = []
    for computed, new in reqs:
        nblocks = -(-(computed + new) // bs)
        tables.append((torch.randint(1, 500, (nblocks,), generator=gen).tolist(),))
    width = max(len(t[0]) for t in tables)
    placement = ShuffledPlacement(num_blocks=500, seed=seed) if seed % 2 else Placement()
    out = build_batch_tables(tables, [c for c, _ in reqs], [n for _, n in reqs],
                             block_sizes=[bs], num_table_blocks=[width], placement=placement)
    slots, positions, owners = [], [], []
    for r, ((computed, new), (table,)) in enumerate(zip(reqs, tables, strict=True)):
        phys = placement.physical(torch.tensor(table)).tolist()
        assert out.block_tables[0][r].tolist() == phys + [0] * (width - len(phys))
        for p in range(computed, computed + new):
            slots.append(phys[p // bs] * bs + p % bs)
            positions.append(p)
            owners.append(r)
    assert out.slot_mappings[0] is not None
    assert out.slot_mappings[0].tolist() == slots
    assert out.positions.tolist() == positions and out.token_to_request.tolist() == owners
