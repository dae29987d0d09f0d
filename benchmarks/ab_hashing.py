#!/usr/bin/env python3
"""Prompt hashing, per 16-token block, interleaved call by call (best of N each) so machine
noise hits every side alike: pagedkv ``sha256_cbor`` and ``xxhash_cbor`` with the memo off
(every block really hashed) and, where vLLM is importable (run with the vLLM venv's
python, see benchmarks/README.md), vLLM's default request block hasher (pickle + SHA-256).

Prompts are fresh random tokens (vocab 32,000) for every call, as in a real workload.

    /path/to/venv-vllm/bin/python benchmarks/ab_hashing.py
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from pagedkv import BlockHasher, Request


def vllm_hasher() -> Callable[[list[int]], float] | None:
    try:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request as VllmRequest
    except ImportError:
        return None
    fn = get_hash_fn_by_name("sha256")
    init_none_hash(fn)
    hasher = get_request_block_hasher(16, fn)
    params = SamplingParams(max_tokens=1)

    def run(tokens: list[int]) -> float:
        r = VllmRequest(request_id="x", prompt_token_ids=tokens, sampling_params=params,
                        pooling_params=None, block_hasher=None)
        t = time.perf_counter()
        r._block_hasher = hasher
        r.update_block_hashes()
        return time.perf_counter() - t

    return run


def pagedkv_hasher(algo: str) -> Callable[[list[int]], float] | None:
    try:
        hasher = BlockHasher(16, algo=algo, memo_blocks=0)
    except ImportError:
        return None

    def run(tokens: list[int]) -> float:
        req = Request("x", tokens)
        t = time.perf_counter()
        req.set_hasher(hasher)
        return time.perf_counter() - t

    return run


def main() -> None:
    sides = {"vllm sha256 (pickle)": vllm_hasher(),
             "pagedkv sha256_cbor": pagedkv_hasher("sha256_cbor"),
             "pagedkv xxhash_cbor": pagedkv_hasher("xxhash_cbor")}
    runs = {k: v for k, v in sides.items() if v is not None}
    rng = random.Random(0)
    print("us per 16-token block, best of N interleaved calls, fresh prompts")
    print(f"{'prompt tokens':>14} " + " ".join(f"{k:>22}" for k in runs))
    for n in (1024, 4096, 16384):
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(max(8, 120_000 // n)):
            tokens = [rng.randrange(32000) for _ in range(n)]
            for name, run in runs.items():
                best[name] = min(best[name], run(tokens))
        print(f"{n:>14} " + " ".join(f"{best[k] / (n // 16) * 1e6:>22.3f}" for k in runs))


if __name__ == "__main__":
    main()
