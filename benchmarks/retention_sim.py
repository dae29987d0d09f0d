#!/usr/bin/env python3
"""Hit rates of retention policies in the simulator's pure-cache mode, beside LRU, the
offline-optimal (Belady) bound and the infinite-cache ceiling, at two capacities.

Workloads: the Mooncake conversation trace (first ``--trace-limit`` requests), Mooncake's
synthetic trace (first ``--synthetic-limit``), the simulator's shared-system-prompt
generator, and a two-tenant mix of it (tenant ``chat``: the system-prompt requests;
tenant ``batch``: one-off long documents between them), each at two capacities.
Capacities are fractions of the blocks an unlimited cache would end up holding.

    python benchmarks/retention_sim.py
    python benchmarks/retention_sim.py --trace data/traces/conversation_trace.jsonl.gz \\
        --trace-limit 3000 --only conversation_trace system-prompts

Uses only public APIs: ``pagedkv.sim`` (workloads, bounds) and
``pagedkv.sim.retention_replay`` (policies and the replay).
"""

from __future__ import annotations

import argparse
import os

from pagedkv.sim import SimRequest, Workload, belady_hits, load_trace, system_prompts
from pagedkv.sim.bounds import access_sequence, infinite_cache_hits
from pagedkv.sim.pure_cache import unlimited_num_blocks
from pagedkv.sim.retention_replay import (
    LRU,
    PinPopularPrefixes,
    PopularityPriority,
    SimRetentionPolicy,
    TenantQuota,
    replay_pure_cache,
)

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "data", "traces")
TRACE = os.path.join(TRACES, "conversation_trace.jsonl.gz")
SYNTHETIC = os.path.join(TRACES, "synthetic_trace.jsonl.gz")


def tenant_mix(num_docs_per_question: int = 1, doc_tokens: int = 3000) -> Workload:
    """The system-prompt generator's requests as tenant ``chat``, each followed by
    ``num_docs_per_question`` one-off documents of tenant ``batch``."""
    base = system_prompts(num_groups=8, questions_per_group=40, system_tokens=1536,
                          question_tokens=200)
    reqs: list[SimRequest] = []
    next_token = 10_000_000
    for r in base.requests:
        reqs.append(SimRequest(request_id=f"chat/{r.request_id}", arrival_s=len(reqs) * 0.05,
                               num_prompt_tokens=r.num_prompt_tokens,
                               num_output_tokens=r.num_output_tokens,
                               prompt_token_ids=r.prompt_token_ids))
        for _ in range(num_docs_per_question):
            doc = tuple(range(next_token, next_token + doc_tokens))
            next_token += doc_tokens
            reqs.append(SimRequest(request_id=f"batch/d{len(reqs)}", arrival_s=len(reqs) * 0.05,
                                   num_prompt_tokens=doc_tokens, num_output_tokens=16,
                                   prompt_token_ids=doc))
    return Workload(name="tenant-mix", requests=tuple(reqs),
                    description="8 system prompts x 40 questions (chat) + one-off docs (batch)")


def policies(tenants: bool) -> list[SimRetentionPolicy]:
    out: list[SimRetentionPolicy] = [LRU(), PinPopularPrefixes(), PopularityPriority()]
    if tenants:
        out.append(TenantQuota(fractions={"batch": 0.1}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--trace-limit", type=int, default=3000)
    ap.add_argument("--trace-block-size", type=int, default=64)
    ap.add_argument("--synthetic", default=SYNTHETIC)
    ap.add_argument("--synthetic-limit", type=int, default=1000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME",
                    help="workloads to run, by name prefix (e.g. conversation_trace)")
    a = ap.parse_args()
    workloads = [
        (load_trace(a.trace, limit=a.trace_limit), a.trace_block_size, False, (0.1, 0.3)),
        (load_trace(a.synthetic, limit=a.synthetic_limit), a.trace_block_size, False,
         (0.1, 0.3)),
        (system_prompts(num_groups=8, questions_per_group=40), a.block_size, False,
         (0.1, 0.15)),
        (tenant_mix(), a.block_size, True, (0.012, 0.02)),
    ]
    names = ["lru", "pin-popular", "popularity-priority", "tenant-quota"]
    print("pure-cache hit rate (all requests); capacity = fraction of an unlimited "
          "cache's blocks")
    print(f"{'workload':<16} {'cap':>5} {'blocks':>7} " + " ".join(f"{n[:16]:>16}" for n in names)
          + f" {'belady':>7} {'infinite':>8}")
    for w, bs, tenants, fractions in workloads:
        if a.only and not any(w.name.startswith(o) for o in a.only):
            continue
        seq = access_sequence(w, bs)
        full = unlimited_num_blocks(seq)
        inf = infinite_cache_hits(seq).hit_rate()
        for f in fractions:
            num_blocks = max(2, int(full * f))
            cells = {}
            for pol in policies(tenants):
                cells[pol.name] = replay_pure_cache(w, block_size=bs, num_blocks=num_blocks,
                                                    policy=pol).hit_rate()
            lru = cells["lru"]
            bel = belady_hits(seq, num_blocks - 1).hit_rate()
            row = []
            for n in names:
                if n not in cells:
                    row.append(f"{'n/a':>16}")
                else:
                    row.append(f"{cells[n]:>7.4f} ({cells[n] - lru:+.3f})"[:16].rjust(16))
            print(f"{w.name[:16]:<16} {f:>5.2f} {num_blocks:>7} " + " ".join(row)
                  + f" {bel:>7.4f} {inf:>8.4f}")


if __name__ == "__main__":
    main()
