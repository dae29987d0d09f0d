"""``SingleTypeManager.pop_blocks_for_free`` strips exactly the table's leading null
blocks (later nulls kept, ``keep_null_head`` keeps all), and a one-group coordinator's
pop is its group's: checked on random tables against the rule written plainly."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from pagedkv.core.coordinator_base import Coordinator
from pagedkv.core.managers.base import SingleTypeManager


def _rule(table: list[int], keep_null_head: bool) -> list[int]:
    if keep_null_head:
        return list(table)
    i = 0
    while i < len(table) and table[i] == 0:
        i += 1
    return table[i:]


def _group(tables: dict[str, list[int]], keep_null_head: bool) -> Any:
    m = SimpleNamespace(req_to_blocks=tables, num_cached_blocks={r: 1 for r in tables},
                        keep_null_head=keep_null_head)
    m.pop_blocks_for_free = SingleTypeManager.pop_blocks_for_free.__get__(m)
    return m


@pytest.mark.parametrize("seed", range(20))
def test_pop_strips_leading_nulls_only(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        num_groups = rng.randint(1, 3)
        groups, want = [], []
        for _g in range(num_groups):
            keep = rng.random() < 0.2
            table = ([0] * rng.randint(0, 6)
                     + [rng.choice([0, rng.randint(1, 99)]) for _ in range(rng.randint(0, 6))])
            groups.append(_group({"r": list(table)} if rng.random() < 0.9 else {}, keep))
            if groups[-1].req_to_blocks:
                want.extend(_rule(table, keep))
        coordinator = SimpleNamespace(managers=groups)
        got = Coordinator.pop_blocks_for_free(coordinator, "r")  # type: ignore[arg-type]
        assert got == want
        assert all("r" not in g.req_to_blocks and "r" not in g.num_cached_blocks
                   for g in groups)
        assert Coordinator.pop_blocks_for_free(coordinator, "r") == []  # type: ignore[arg-type]


def test_release_of_a_tuple_checks_as_a_list() -> None:
    from pagedkv.core.held_blocks import HeldBlocks
    from pagedkv.core.pool import BlockPool
    from pagedkv.errors import InvalidArgumentError

    pool = BlockPool(6, hash_block_size=4)
    held = HeldBlocks(pool)
    blocks = pool.get_new_blocks(2)
    held.hold(blocks)
    with pytest.raises(InvalidArgumentError):
        held.release((blocks[1], 5))
    assert held.counts == {blocks[0]: 1, blocks[1]: 1}
    held.release((blocks[1], 0, blocks[0]))
    assert held.counts == {} and pool.free_queue.num_free == 5
    with pytest.raises(InvalidArgumentError):
        held.release("12")  # type: ignore[arg-type]
