#!/usr/bin/env python3
"""What building a step's block tables and slot mappings costs next to a decode step of
the tiny model, at 256 running requests of 4,096 tokens (block size 16, full attention).

    python benchmarks/torch_tables.py [--requests 256] [--tokens 4096] [--rounds 3]

Per round, alternating: (a) ``get_block_ids`` for every request + ``build_batch_tables``
for a one-token decode of each (what an engine does per step on top of the manager's
``allocate_slots``, which is timed apart); (b) the tiny decoder's decode step over the same
tables (2 full-attention layers, every query gathering all 4,112 key positions). Median
of ``--rounds``. One torch thread (the machine is shared; set ``--threads`` to change).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
from pagedkv.planner import plan_kv_cache
from pagedkv.torch import KVCacheTensors, TinyDecoder, TinyModelConfig, build_batch_tables


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    bs = 16
    max_len = -(-(args.tokens + args.rounds + 1) // bs) * bs
    cfg = TinyModelConfig(max_model_len=max_len)
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=cfg.num_kv_heads,
                             head_size=cfg.head_size, dtype_bytes=4)
    num_blocks = args.requests * (max_len // bs) + 1
    plan = plan_kv_cache({"full.0": spec, "full.1": spec}, available_bytes=1 << 40,
                         max_model_len=max_len, num_blocks=num_blocks)
    cache = KVCacheTensors(plan, dtype=torch.float32, fill=0.0)
    mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=num_blocks,
                                     max_model_len=max_len, enable_caching=True))
    model = TinyDecoder(cfg, cache)
    reqs = []
    for i in range(args.requests):
        req = mgr.new_request(f"r{i}", [(i * 7 + t) % cfg.vocab_size for t in range(args.tokens)])
        assert mgr.allocate_slots(req, args.tokens) is not None
        req.num_computed_tokens = args.tokens
        req.append_output_tokens(1)
        reqs.append(req)
    width = [max_len // bs]
    print(f"{args.requests} requests x {args.tokens} tokens, block size {bs}: "
          f"{args.requests * (args.tokens // bs + 1):,} block ids per step; torch "
          f"{torch.__version__}, {args.threads} thread(s)")
    alloc_s, tables_s, decode_s = [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for req in reqs:
            assert mgr.allocate_slots(req, 1) is not None
        t1 = time.perf_counter()
        tables = build_batch_tables(
            [mgr.get_block_ids(r.request_id) for r in reqs],
            [r.num_computed_tokens for r in reqs], [1] * len(reqs),
            block_sizes=[bs], num_table_blocks=width)
        t2 = time.perf_counter()
        tokens = torch.tensor([r.all_token_ids[-1] for r in reqs])
        model.forward(tokens, tables, torch.arange(len(reqs)))
        t3 = time.perf_counter()
        for req in reqs:
            req.num_computed_tokens += 1
            req.append_output_tokens(1)
        alloc_s.append(t1 - t0)
        tables_s.append(t2 - t1)
        decode_s.append(t3 - t2)
    a, b, c = (statistics.median(x) * 1e3 for x in (alloc_s, tables_s, decode_s))
    print(f"manager allocate_slots x {args.requests}: {a:8.2f} ms")
    print(f"block tables + slot mappings:      {b:8.2f} ms  ({100 * b / c:.2f} % of a decode step)")
    print(f"tiny-model decode step:            {c:8.2f} ms")


if __name__ == "__main__":
    main()
