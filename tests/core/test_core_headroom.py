"""Allocation headroom as vLLM 0.33: ``reserved_blocks`` on every call, the ``watermark``
on admissions (a request holding no blocks) while ``has_scheduled_reqs``.

The differential suite draws both per allocation and compares with vLLM after every op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pagedkv import CacheConfig, FullAttentionSpec, InvalidArgumentError

# 10 blocks: block 0 is the null block, 9 usable. Block size 4.


def test_watermark_applies_to_admissions_with_scheduled_requests(
    make_mgr: Callable[..., Any],
) -> None:
    mgr = make_mgr(num_blocks=10, watermark=0.2)  # int(0.2 * 10) = 2 blocks
    assert mgr.watermark_blocks == 2
    a = mgr.new_request("a", list(range(32)))  # 8 blocks: 8 + 2 > 9 free
    assert mgr.allocate_slots(a, 32) is None
    assert mgr.num_free_blocks == 9
    assert mgr.allocate_slots(a, 28) is not None  # 7 + 2 = 9: fits exactly
    mgr.free(a)
    # Nothing else scheduled this step: no watermark.
    assert mgr.allocate_slots(a, 32, has_scheduled_reqs=False) is not None
    assert mgr.num_free_blocks == 1
    b = mgr.new_request("b", list(range(100, 104)))
    assert mgr.allocate_slots(b, 4) is None  # 1 + 2 > 1
    assert mgr.allocate_slots(b, 4, has_scheduled_reqs=False) is not None


def test_watermark_not_applied_to_running_requests(make_mgr: Callable[..., Any]) -> None:
    mgr = make_mgr(num_blocks=10, watermark=0.2)
    a = mgr.new_request("a", list(range(32)))
    assert mgr.allocate_slots(a, 28, has_scheduled_reqs=False) is not None
    a.num_computed_tokens = 28
    # Running: the last free blocks may go, watermark or not.
    assert mgr.allocate_slots(a, 4) is not None
    assert mgr.num_free_blocks == 1


def test_reserved_blocks_apply_to_every_call(make_mgr: Callable[..., Any]) -> None:
    mgr = make_mgr(num_blocks=10)
    a = mgr.new_request("a", list(range(36)))
    assert mgr.allocate_slots(a, 28, reserved_blocks=3) is None  # 7 + 3 > 9
    assert mgr.allocate_slots(a, 24, reserved_blocks=3) is not None  # 6 + 3 = 9
    a.num_computed_tokens = 24
    assert mgr.allocate_slots(a, 4, reserved_blocks=3) is None  # running, still refused
    before = repr(mgr.debug_state())
    assert mgr.allocate_slots(a, 4, reserved_blocks=3) is None
    assert repr(mgr.debug_state()) == before  # a refusal changes nothing
    assert mgr.allocate_slots(a, 4, reserved_blocks=2) is not None


def test_headroom_off_is_the_default(make_mgr: Callable[..., Any]) -> None:
    mgr = make_mgr(num_blocks=10)
    assert mgr.watermark_blocks == 0
    a = mgr.new_request("a", list(range(36)))
    assert mgr.allocate_slots(a, 36) is not None
    assert mgr.num_free_blocks == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reserved_blocks": -1}, "reserved_blocks must be an int >= 0"),
        ({"reserved_blocks": 1.5}, "reserved_blocks must be an int >= 0"),
        ({"reserved_blocks": True}, "reserved_blocks must be an int >= 0"),
        ({"has_scheduled_reqs": 1}, "has_scheduled_reqs must be a bool"),
        ({"has_scheduled_reqs": None}, "has_scheduled_reqs must be a bool"),
    ],
)
def test_bad_headroom_arguments_raise_state_unchanged(
    make_mgr: Callable[..., Any], kwargs: dict[str, Any], match: str
) -> None:
    mgr = make_mgr(num_blocks=10)
    a = mgr.new_request("a", list(range(12)))
    assert mgr.allocate_slots(a, 8) is not None
    a.num_computed_tokens = 8
    for req in (a, mgr.new_request("b", list(range(4)))):  # running and first allocation
        before = repr(mgr.debug_state())
        with pytest.raises(InvalidArgumentError, match=match):
            mgr.allocate_slots(req, 4, **kwargs)
        assert repr(mgr.debug_state()) == before


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.1", None])
def test_bad_watermark_is_refused(bad: object) -> None:
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    with pytest.raises(InvalidArgumentError, match="watermark"):
        CacheConfig(groups=(spec,), num_blocks=10, max_model_len=64,
                    watermark=bad)  # type: ignore[arg-type]


def test_leftover_lookahead_slots_do_not_count_as_free(make_mgr: Callable[..., Any]) -> None:
    """A step needing no block (lookahead slots from an earlier step cover it) needs 0
    blocks, not a negative number that would eat into the reserve (vLLM clamps at 0)."""
    mgr = make_mgr(num_blocks=10)
    a = mgr.new_request("a", list(range(4)))
    assert mgr.allocate_slots(a, 4, num_lookahead_tokens=8) is not None  # 3 blocks
    a.num_computed_tokens = 4
    a.append_output_tokens(7)
    assert mgr.num_free_blocks == 6
    assert mgr.allocate_slots(a, 1, reserved_blocks=7) is None  # 0 + 7 > 6
    assert mgr.allocate_slots(a, 1, reserved_blocks=6) == ([],)
