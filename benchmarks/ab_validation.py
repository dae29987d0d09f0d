#!/usr/bin/env python3
"""What the façade's boundary checks (``pagedkv/core/validation.py``) cost the hot path.

Two managers are driven by the same continuous-batching loop, operation by operation (the
side that goes first alternates): the real :class:`pagedkv.KVCacheManager`, and a subclass
whose lookup / allocate / free are the code as it was before the checks (sign checks
only: no registry, no hit verification, no type tests). Each operation is timed on each side,
so machine noise hits both alike. Prints the summed time of the core operations (lookup,
allocate, free, as the harness counts them) and the checks' share. Workload: the
``pagedkv bench`` workloads.

    python benchmarks/ab_validation.py [--workload shared-prefix] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from lockstep import replay_lockstep

from pagedkv import ComputedBlocks, FullAttentionSpec, InvalidArgumentError, KVCacheManager
from pagedkv.bench import WORKLOADS, BenchConfig, build_workload


class Unchecked(KVCacheManager):
    """The façade as it was before the boundary checks (for this measurement only)."""

    def get_computed_blocks(self, request: Any) -> ComputedBlocks:
        num_tokens = request.num_tokens
        found = self.coordinator.find_longest_cache_hit(request.block_hashes, num_tokens - 1)
        if found is None:
            return self._empty_hit
        blocks, num_hit = found
        lookups = self.lookups
        lookups.requests += 1
        lookups.queries += num_tokens
        lookups.hits += num_hit
        self.hit_rate_window.observe(num_tokens, num_hit)
        return ComputedBlocks(blocks, num_hit, self.issuer_token, request.request_id)

    def allocate_slots(self, request: Any, num_new_tokens: int, *,
                       new_computed_blocks: ComputedBlocks | None = None,
                       num_new_computed_tokens: int | None = None,
                       num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       num_encoder_tokens: int = 0,
                       delay_caching: bool = False) -> tuple[list[int], ...] | None:
        # The façade's allocate_slots as it was before the boundary checks (commit
        # 9cfccaf): sign checks and the hit-for-a-live-request check only.
        rid = request.request_id
        if num_new_computed_tokens is None:
            num_new_computed_tokens = (
                new_computed_blocks.num_computed_tokens if new_computed_blocks else 0
            )
        if (num_new_tokens < 0 or num_new_computed_tokens < 0 or num_lookahead_tokens < 0
                or num_external_computed_tokens < 0 or num_encoder_tokens < 0):
            raise InvalidArgumentError("token counts must be >= 0")
        if num_new_tokens == 0 and not num_external_computed_tokens and not num_lookahead_tokens:
            raise InvalidArgumentError("nothing to allocate")
        coordinator = self.coordinator
        hit = new_computed_blocks.block_ids if new_computed_blocks is not None else None
        if hit is not None and any(hit) and coordinator.has_request(rid):
            raise InvalidArgumentError("hit blocks for a request that holds blocks")
        num_computed = request.num_computed_tokens
        local_computed = num_computed + num_new_computed_tokens
        max_len = self.max_model_len
        total_computed = min(local_computed + num_external_computed_tokens, max_len)
        num_tokens = min(total_computed + num_new_tokens + num_lookahead_tokens, max_len)
        new_blocks = coordinator.allocate(
            rid, hit, num_computed_tokens=num_computed, total_computed_tokens=total_computed,
            num_tokens=num_tokens, num_encoder_tokens=num_encoder_tokens)
        if new_blocks is not None and not delay_caching:
            coordinator.cache_blocks(request, min(total_computed + num_new_tokens,
                                                  request.num_tokens))
        return new_blocks

    def free(self, request: Any) -> None:
        rid = request if isinstance(request, str) else request.request_id
        self.coordinator.free(rid)


def run(workload: str, num_requests: int) -> tuple[float, float]:
    specs, num_blocks = build_workload(BenchConfig(workload=workload,
                                                   num_requests=num_requests))
    max_len = max(len(s.prompt) + len(s.decode) for s in specs)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
    mgrs = [cls.from_spec(spec, num_blocks=num_blocks, max_model_len=max_len)
            for cls in (KVCacheManager, Unchecked)]
    spent = replay_lockstep(mgrs, specs)
    return spent[0], spent[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=WORKLOADS, default="shared-prefix")
    ap.add_argument("--num-requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    shares = []
    for r in range(a.rounds):
        checked, unchecked = run(a.workload, a.num_requests)
        shares.append(100 * (checked / unchecked - 1))
        print(f"round {r + 1}: core operations checked {checked:.3f} s, unchecked "
              f"{unchecked:.3f} s, checks cost {shares[-1]:+.1f} %")
    print(f"workload {a.workload}: median cost of the checks {statistics.median(shares):+.1f} %")


if __name__ == "__main__":
    main()
