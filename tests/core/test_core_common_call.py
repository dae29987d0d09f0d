"""allocate_slots' common-call test and the per-call paths kept cheap on the pure core.

The common call (a running request, every keyword at its default) is recognised by
identity tests; every other value, including zeros of another type, must still reach
the full rule and be refused with state unchanged. Run on the core the session picked
(compiled by default, ``PAGEDKV_PURE=1`` for the pure one) and on a pure manager built
inside ``native.forced_pure()``.
"""

from __future__ import annotations

import gc
import platform
from typing import Any

import pytest

from pagedkv import FullAttentionSpec, KVCacheManager, Request
from pagedkv.core import native
from pagedkv.core.managers.full import FullAttentionManager
from pagedkv.errors import InvalidArgumentError

SPEC = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)

#: Keywords whose value is a zero (or the default's truth value) of the wrong type that
#: the rule refuses: the identity test must not take them for the default.
ODD_DEFAULTS: list[dict[str, Any]] = [
    {"num_lookahead_tokens": 0.0}, {"num_lookahead_tokens": False},
    {"num_external_computed_tokens": 0.0}, {"num_encoder_tokens": False},
    {"reserved_blocks": 0.0}, {"reserved_blocks": False}, {"num_in_flight_tokens": 0.5},
    {"has_scheduled_reqs": 1}, {"full_sequence_must_fit": 0}, {"lenient_counts": 0},
]

#: The defaults spelled out, and a zero in-flight count of another type (no window to
#: free: the rule takes it as none): the checked path gives the common call's step.
SPELLED_DEFAULTS: list[dict[str, Any]] = [
    {"num_lookahead_tokens": 0, "num_external_computed_tokens": 0, "num_encoder_tokens": 0},
    {"num_in_flight_tokens": 0.0}, {"new_computed_blocks": None},
]


def _running(pure: bool) -> tuple[KVCacheManager, Request]:
    """A manager (pure when ``pure``) and one request holding 3 blocks, computed."""
    def build() -> tuple[KVCacheManager, Request]:
        mgr = KVCacheManager.from_spec(SPEC, num_blocks=32, max_model_len=64)
        req = Request("r", list(range(10)), hasher=mgr.hasher)
        assert mgr.allocate_slots(req, 10) is not None
        req.num_computed_tokens = 10
        return mgr, req
    if pure:
        with native.forced_pure():
            return build()
    return build()


@pytest.mark.parametrize("pure", [False, True])
@pytest.mark.parametrize("keywords", ODD_DEFAULTS, ids=repr)
def test_odd_zero_keywords_are_refused(pure: bool, keywords: dict[str, Any]) -> None:
    mgr, req = _running(pure)
    req.append_output_tokens(7)
    before = mgr.debug_state()
    with pytest.raises(InvalidArgumentError):
        mgr.allocate_slots(req, 1, **keywords)
    assert mgr.debug_state() == before


@pytest.mark.parametrize("pure", [False, True])
@pytest.mark.parametrize("keywords", SPELLED_DEFAULTS, ids=repr)
def test_defaults_step_as_the_common_call(pure: bool, keywords: dict[str, Any]) -> None:
    (mgr, req), (plain, twin) = _running(pure), _running(pure)
    for r in (req, twin):
        r.append_output_tokens([7, 8, 9])
    assert mgr.allocate_slots(req, 3, **keywords) == plain.allocate_slots(twin, 3)
    assert mgr.debug_state() == plain.debug_state()


@pytest.mark.parametrize("pure", [False, True])
def test_common_call_and_default_keywords_spelled_out(pure: bool) -> None:
    mgr, req = _running(pure)
    for step in range(6):
        req.append_output_tokens(step)
        kw: dict[str, Any] = {} if step % 2 else {
            "num_lookahead_tokens": 0, "reserved_blocks": 0, "has_scheduled_reqs": True,
            "full_sequence_must_fit": False, "num_in_flight_tokens": 0,
            "lenient_counts": False}
        assert mgr.allocate_slots(req, 1, **kw) is not None
        req.num_computed_tokens += 1
    assert len(mgr.get_block_ids(req.request_id)[0]) == 4  # 16 tokens in blocks of 4


@pytest.mark.parametrize("pure", [False, True])
def test_tokens_appended_behind_the_facade_are_refused(pure: bool) -> None:
    mgr, req = _running(pure)
    req.all_token_ids.append(5)  # skips hashing: the request's own count disagrees
    before = mgr.debug_state()
    with pytest.raises(InvalidArgumentError, match="append_output_tokens"):
        mgr.allocate_slots(req, 1)
    assert mgr.debug_state() == before


@pytest.mark.parametrize("pure", [False, True])
def test_too_many_new_tokens_refused_on_the_common_call(pure: bool) -> None:
    mgr, req = _running(pure)
    before = mgr.debug_state()
    with pytest.raises(InvalidArgumentError):
        mgr.allocate_slots(req, 1)  # no token appended: 10 computed + 1 > 10
    assert mgr.debug_state() == before


def _group_manager(mgr: KVCacheManager) -> FullAttentionManager:
    m = mgr.coordinator.managers[0]
    assert isinstance(m, FullAttentionManager)
    return m


@pytest.mark.skipif(platform.python_implementation() != "CPython",
                    reason="CPython's inline instance values")
def test_group_manager_attributes_stay_inline() -> None:
    """Building the façade (the coordinator's admission plan included) must not turn a
    manager's attributes into a plain dict (``vars(m)`` does): every attribute read
    on the per-call paths would then take the slower dict lookup. Read through the
    garbage collector's view, which does not build the dict itself."""
    for pure in (False, True):
        mgr, _ = _running(pure)
        m = _group_manager(mgr)
        holders = [r for r in gc.get_referents(m) if type(r) is dict and "pool" in r]
        assert holders == []


def test_lookup_same_on_both_kernel_sets() -> None:
    hits = []
    for pure in (False, True):
        mgr, req = _running(pure)
        mgr.free(req)
        again = Request("s", list(range(10)), hasher=mgr.hasher)
        hit = mgr.get_computed_blocks(again)
        hits.append((hit.num_computed_tokens, hit.block_ids))
    assert hits[0] == hits[1] == (8, ([1, 2],))
