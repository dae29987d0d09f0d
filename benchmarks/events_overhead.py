#!/usr/bin/env python3
"""What turning KV-cache events on costs the manager.

Two managers, one with events off and one with events on (buffered, drained every step as
an engine does), are driven by the same continuous-batching loop, operation by operation:
every lookup / allocate / free is done on both, timed separately, so machine noise hits
both sides alike. Prints the summed time of the core operations on each side and the
overhead. Workload: the ``pagedkv bench`` shared-prefix workload.

    python benchmarks/events_overhead.py
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from typing import Any

from pagedkv import FullAttentionSpec, KVCacheManager
from pagedkv.bench import WORKLOADS, BenchConfig, build_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=WORKLOADS, default="shared-prefix")
    ap.add_argument("--num-requests", type=int, default=2000)
    a = ap.parse_args()
    specs, num_blocks = build_workload(BenchConfig(workload=a.workload,
                                              num_requests=a.num_requests))
    max_len = max(len(s.prompt) + len(s.decode) for s in specs)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
    mgrs = [KVCacheManager.from_spec(spec, num_blocks=num_blocks, max_model_len=max_len,
                                     enable_events=events) for events in (False, True)]
    spent = [0.0, 0.0]
    perf = time.perf_counter
    num_events = 0

    def both(op: str, reqs: list[Any], *args: Any) -> list[Any]:
        out = []
        for side, (mgr, req) in enumerate(zip(mgrs, reqs, strict=True)):
            t = perf()
            if op == "lookup":
                r = mgr.get_computed_blocks(req)
            elif op == "prefill":
                r = mgr.allocate_slots(req, req.num_tokens - args[side].num_computed_tokens,
                                       new_computed_blocks=args[side])
            elif op == "decode":
                r = mgr.allocate_slots(req, 1)
            else:
                r = mgr.free(req)
            spent[side] += perf() - t
            out.append(r)
        return out

    pending = deque(specs)
    running: list[list[Any]] = []
    while pending or running:
        while pending and len(running) < 32:
            s = pending.popleft()
            reqs = [m.new_request(s.rid, s.prompt) for m in mgrs]
            hits = both("lookup", reqs)
            new = both("prefill", reqs, *hits)
            assert (new[0] is None) == (new[1] is None)
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
            new = both("decode", reqs)
            for r in reqs:
                r.num_computed_tokens += 1
            if i + 1 >= len(s.decode) or new[0] is None:
                both("free", reqs)
            else:
                item[2] = i + 1
                still.append(item)
        running = still
        num_events += len(mgrs[1].take_events())
    off, on = spent
    print(f"workload {a.workload}: {len(specs)} requests, {num_events} events")
    print(f"core operations: events off {off:.3f} s, on {on:.3f} s, "
          f"overhead {100 * (on / off - 1):.1f} %")


if __name__ == "__main__":
    main()
