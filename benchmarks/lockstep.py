"""Replay one workload through several managers in lockstep, timing each manager's calls.

The A/B benchmarks (`events_overhead.py`, `ab_validation.py`, `observe_speed.py`) compare
managers that must give the same answers: the same requests go to every manager, one
operation at a time, and the manager that goes first rotates from operation to operation so
that a slow moment of a shared machine falls on every side alike. Same loop as
``pagedkv bench``: admit up to ``concurrency`` requests per step (lookup, allocate the
prompt), then one decode token per running request; free after the last one.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from pagedkv import KVCacheManager


def replay_lockstep(mgrs: Sequence[KVCacheManager], specs: Sequence[Any], *,
                    concurrency: int = 32,
                    after_step: Callable[[], None] | None = None) -> list[float]:
    """Seconds spent in lookup / allocate / free, per manager (in ``mgrs`` order).

    ``specs`` are ``pagedkv.bench.build_workload`` requests (``rid``, ``prompt``,
    ``decode``). Raises AssertionError if the managers allocate differently.
    """
    spent = [0.0] * len(mgrs)
    perf = time.perf_counter
    turn = [0]

    def each(op: str, reqs: list[Any], hits: list[Any] | None = None) -> list[Any]:
        out: list[Any] = [None] * len(mgrs)
        turn[0] += 1
        for k in range(len(mgrs)):
            side = (k + turn[0]) % len(mgrs)
            mgr, req = mgrs[side], reqs[side]
            t = perf()
            if op == "lookup":
                r: Any = mgr.get_computed_blocks(req)
            elif op == "prefill":
                assert hits is not None
                r = mgr.allocate_slots(req, req.num_tokens - hits[side].num_computed_tokens,
                                       new_computed_blocks=hits[side])
            elif op == "decode":
                r = mgr.allocate_slots(req, 1)
            else:
                r = mgr.free(req)
            spent[side] += perf() - t
            out[side] = r
        return out

    pending = deque(specs)
    running: list[list[Any]] = []
    while pending or running:
        while pending and len(running) < concurrency:
            s = pending.popleft()
            reqs = [m.new_request(s.rid, s.prompt) for m in mgrs]
            hits = each("lookup", reqs)
            new = each("prefill", reqs, hits)
            assert all(n == new[0] for n in new), "the managers allocated differently"
            if new[0] is None:
                pending.appendleft(s)
                break
            for r in reqs:
                r.num_computed_tokens = r.num_tokens
            running.append([reqs, s, 0])
        still = []
        for item in running:
            reqs, s, i = item
            for r in reqs:
                r.append_output_tokens(s.decode[i])
            new = each("decode", reqs)
            assert all(n == new[0] for n in new), "the managers allocated differently"
            for r in reqs:
                r.num_computed_tokens += 1
            if i + 1 >= len(s.decode) or new[0] is None:
                each("free", reqs)
            else:
                item[2] = i + 1
                still.append(item)
        running = still
        if after_step is not None:
            after_step()
    return spent
