"""Every public call's documented error, raised the same way by the compiled core and the
pure core: the same exception type, the same message, and the state unchanged (equal
``debug_state()`` before and after, and between the cores).

One case per public call of the façade, the hasher and the request (several for the calls
that take token ids, the compiled core's input). Skips without the compiled core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from test_core_native import SPEC, manager_pair

from pagedkv import BlockHasher, KVCacheManager, Request
from pagedkv.core import native
from pagedkv.errors import PagedKVError

pytestmark = pytest.mark.skipif(native.active() is None,
                                reason=f"no compiled core: {native.IMPORT_ERROR}")

Call = Callable[[KVCacheManager, Request], Any]

BAD_TOKENS: list[Any] = [[-1], [1.5], ["7"], [1 << 64], [None], [[3]]]



def _new_request(tokens: list[Any]) -> Call:
    return lambda m, r: m.new_request("x", [1] * 8 + tokens)


def _append(tokens: list[Any]) -> Call:
    return lambda m, r: r.append_output_tokens(tokens)


def _extend(tokens: list[Any]) -> Call:
    # A block of bad ids after a good one: the compiled loop sees them first.
    return lambda m, r: m.hasher.extend([], [1] * 4 + tokens * 4)


CASES: dict[str, Call] = {
    "from_spec": lambda m, r: KVCacheManager.from_spec(SPEC, num_blocks=4),
    "new_request id": lambda m, r: m.new_request(7, [1, 2]),  # type: ignore[arg-type]
    "new_request duplicate": lambda m, r: m.new_request("live", [1, 2]),
    "new_request too long": lambda m, r: m.new_request("x", list(range(65))),
    "new_request empty": lambda m, r: m.new_request("x", []),
    "new_request extras": lambda m, r: m.new_request("x", [1], hash_extras=3),
    "new_request hashes": lambda m, r: m.new_request("x", [1] * 8, block_hashes=[1, 2]),
    **{f"new_request tokens {t!r}": _new_request(t) for t in BAD_TOKENS},
    **{f"append_output_tokens {t!r}": _append(t) for t in BAD_TOKENS},
    "Request tokens": lambda m, r: Request("x", [1, 2, 3, -4], hasher=m.hasher),
    "get_computed_blocks": lambda m, r: m.get_computed_blocks("live"),  # type: ignore[arg-type]
    "estimate_cached_tokens": lambda m, r: m.estimate_cached_tokens(3),  # type: ignore[arg-type]
    "allocate_slots zero": lambda m, r: m.allocate_slots(r, 0),
    "allocate_slots type": lambda m, r: m.allocate_slots(r, "3"),  # type: ignore[arg-type]
    "allocate_slots past": lambda m, r: m.allocate_slots(r, 999),
    "allocate_slots hit": lambda m, r: m.allocate_slots(r, 1, new_computed_blocks=object()),
    "cache_blocks": lambda m, r: m.cache_blocks(r, "3"),  # type: ignore[arg-type]
    "free": lambda m, r: m.free(3),  # type: ignore[arg-type]
    "pop_blocks_for_free": lambda m, r: m.pop_blocks_for_free(None),  # type: ignore[arg-type]
    "release_blocks": lambda m, r: m.release_blocks([99]),
    "truncate_computed_blocks": lambda m, r: m.truncate_computed_blocks(
        object(), 0),  # type: ignore[arg-type]
    "record_blocks_for_zeroing": lambda m, r: m.record_blocks_for_zeroing("nobody", 0),
    "get_block_ids": lambda m, r: m.get_block_ids("nobody"),
    "get_block_ids_for_computed_tokens": lambda m, r: m.get_block_ids_for_computed_tokens(
        "nobody", 0),
    "get_num_common_prefix_blocks": lambda m, r: m.get_num_common_prefix_blocks("nobody", 1),
    "require_live": lambda m, r: m.require_live("nobody"),
    "lookup_prefix": lambda m, r: m.lookup_prefix("live"),  # type: ignore[arg-type]
    "record_lookup": lambda m, r: m.record_lookup(r, 999),
    "get_num_cached_blocks": lambda m, r: m.get_num_cached_blocks("nobody"),
    "remove_skipped_blocks": lambda m, r: m.remove_skipped_blocks("nobody", 0),
    "block_info": lambda m, r: m.block_info(99),
    "get_cached_block": lambda m, r: m.get_cached_block("h", [0]),  # type: ignore[arg-type]
    "evict_blocks": lambda m, r: m.evict_blocks([-1]),
    "BlockHasher block_size": lambda m, r: BlockHasher(0),
    "BlockHasher memo_blocks": lambda m, r: BlockHasher(4, memo_blocks=-1),
    "BlockHasher algo": lambda m, r: BlockHasher(4, algo="md5"),
    **{f"BlockHasher.extend {t!r}": _extend(t) for t in BAD_TOKENS},
    "BlockHasher.hash_block": lambda m, r: m.hasher.hash_block(m.hasher.seed, [1, -2]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_both_cores_raise_the_same_documented_error(name: str) -> None:
    outcomes = []
    states = []
    for mgr in manager_pair():
        live = mgr.new_request("live", list(range(10)))
        mgr.allocate_slots(live, 10)
        live.num_computed_tokens = 10
        before = mgr.debug_state()
        hashes = list(live.block_hashes)
        with pytest.raises(PagedKVError) as info:
            CASES[name](mgr, live)
        outcomes.append((type(info.value), str(info.value)))
        assert mgr.debug_state() == before and live.block_hashes == hashes
        assert live.all_token_ids == list(range(10))
        states.append(before)
    assert outcomes[0] == outcomes[1]
    assert states[0] == states[1]
