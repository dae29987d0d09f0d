"""Retention misuse and clock faults: documented errors, state unchanged, never an
AssertionError or AttributeError.

* a clock that goes backwards is held at its last reading: no error, and a lease's
  expiry is not undone (a pin that ended stays ended);
* a clock returning NaN, a string or None is refused by name at the next call;
* ``unpin``/``renew`` of something that is not a lease, ``pin`` of something that is not
  a list of hashes, ``pin_prefix`` of something that is not a request: InvalidArgumentError.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from retention_support import FakeClock, make_manager, prompt, run

from pagedkv import InvalidArgumentError


def _pinned_manager() -> tuple[Any, FakeClock, Any, Any]:
    clock = FakeClock()
    clock.now = 100.0
    mgr = make_manager(16, clock)
    req = run(mgr, "sys", prompt(1, 2))
    lease = mgr.retention.pin_prefix(req, ttl_s=10)
    return mgr, clock, req, lease


def test_a_clock_going_backwards_is_held_not_an_assertion() -> None:
    mgr, clock, req, lease = _pinned_manager()
    pinned_free = mgr.num_free_blocks
    clock.now = 50.0                       # stepped back 50 s
    mgr.retention.renew(lease, ttl_s=10)   # no AssertionError; "now" is still 100
    run(mgr, "other", prompt(2, 1))
    mgr.check_invariants()
    clock.now = 111.0                      # 11 s after the held reading: the lease ended
    assert mgr.num_free_blocks > pinned_free
    clock.now = 105.0                      # back again: the expiry is not undone
    assert mgr.num_free_blocks > pinned_free
    mgr.check_invariants()


@pytest.mark.parametrize("reading", [math.nan, math.inf, "soon", None, [1.0]], ids=repr)
def test_a_clock_returning_a_non_number_is_refused_by_name(reading: Any) -> None:
    mgr, clock, req, lease = _pinned_manager()
    before = repr(mgr.debug_state())
    clock.now = reading
    with pytest.raises(InvalidArgumentError, match="clock"):
        mgr.retention.renew(lease, ttl_s=10)
    clock.now = 100.0  # a good reading again (debug_state reads the clock too)
    assert repr(mgr.debug_state()) == before


@pytest.mark.parametrize("bad", [object(), None, 5, "lease", [1]], ids=repr)
def test_unpin_and_renew_of_a_non_lease(bad: Any) -> None:
    mgr, clock, req, lease = _pinned_manager()
    before = repr(mgr.debug_state())
    with pytest.raises(InvalidArgumentError, match="PinLease"):
        mgr.retention.unpin(bad)
    with pytest.raises(InvalidArgumentError, match="PinLease"):
        mgr.retention.renew(bad, ttl_s=5)
    assert repr(mgr.debug_state()) == before


@pytest.mark.parametrize("bad", [None, "abc", b"abc", [1, 2], [b"x", 3], 7], ids=repr)
def test_pin_of_non_hashes(bad: Any) -> None:
    mgr, clock, req, lease = _pinned_manager()
    before = repr(mgr.debug_state())
    with pytest.raises(InvalidArgumentError, match="block_hashes"):
        mgr.retention.pin(bad, ttl_s=5)
    assert repr(mgr.debug_state()) == before


@pytest.mark.parametrize("bad", [None, "sys", [1, 2], object()], ids=repr)
def test_pin_prefix_of_a_non_request(bad: Any) -> None:
    mgr, clock, req, lease = _pinned_manager()
    with pytest.raises(InvalidArgumentError, match="request"):
        mgr.retention.pin_prefix(bad, ttl_s=5)


@pytest.mark.parametrize("ttl", [math.nan, math.inf, 0, -1, True, "5"], ids=repr)
def test_pin_ttl_must_be_finite_positive_seconds(ttl: Any) -> None:
    mgr, clock, req, lease = _pinned_manager()
    with pytest.raises(InvalidArgumentError, match="ttl_s"):
        mgr.retention.pin_prefix(req, ttl_s=ttl)
