#!/usr/bin/env python3
"""Micro-benchmarks behind the NOTE comments in the code: best-of-N timings (other load on
the machine only ever slows a run down, so the minimum is the figure to compare).

    python benchmarks/micro.py            # hashing and pool block operations
"""

from __future__ import annotations

import random
import time

from pagedkv import BlockHasher, Request
from pagedkv.core.pool import BlockPool


def best_of(fn, rounds: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def hashing(rounds: int = 30) -> None:
    rng = random.Random(0)
    tokens = [rng.randrange(32000) for _ in range(8192)]
    num_blocks = len(tokens) // 16
    for algo in ("sha256_cbor", "xxhash_cbor"):
        try:
            hasher = BlockHasher(16, algo=algo, memo_blocks=0)  # every block hashed
        except ImportError:
            print(f"hashing {algo}: skipped (pip install 'pagedkv[fast]')")
            continue
        s = best_of(lambda h=hasher: Request("r", tokens, hasher=h), rounds)
        print(
            f"hashing {algo:<12} {s / num_blocks * 1e6:6.3f} us per 16-token block "
            f"(8,192-token prompt, best of {rounds})"
        )


def hashing_memo(rounds: int = 30) -> None:
    """Prompts that share a 1,024-token system prompt (+256 unique tokens each), hashed
    with the memo on and off, interleaved: the memo's gain on repeated prefixes."""
    rng = random.Random(1)
    system = [rng.randrange(32000) for _ in range(1024)]
    on, off = BlockHasher(16), BlockHasher(16, memo_blocks=0)
    Request("warm", system, hasher=on)
    best = {"on": float("inf"), "off": float("inf")}
    for i in range(rounds):
        prompt = system + [rng.randrange(32000) for _ in range(256)]
        sides = (("on", on), ("off", off))
        for name, hasher in sides if i % 2 else sides[::-1]:  # alternate who goes first
            t = time.perf_counter()
            Request("r", prompt, hasher=hasher)
            best[name] = min(best[name], time.perf_counter() - t)
    print(f"hashing memo         shared 1,024-token prefix + 256 tokens: "
          f"memo off {best['off'] * 1e6:.0f} us, on {best['on'] * 1e6:.0f} us per prompt")
    # The worst case: nothing repeats, every block pays for its memo insert.
    best = {"on": float("inf"), "off": float("inf")}
    for i in range(rounds):
        prompt = [rng.randrange(32000) for _ in range(4096)]
        sides = (("on", on), ("off", off))
        for name, hasher in sides if i % 2 else sides[::-1]:
            t = time.perf_counter()
            Request("r", prompt, hasher=hasher)
            best[name] = min(best[name], time.perf_counter() - t)
    print(f"hashing memo         no reuse (fresh 4,096-token prompts): "
          f"memo off {best['off'] * 1e6:.0f} us, on {best['on'] * 1e6:.0f} us per prompt")


def pool_ops(rounds: int = 40) -> None:
    pool = BlockPool(100_000, hash_block_size=16)
    hasher = BlockHasher(16)
    reqs = [
        Request(f"r{i}", list(range(i * 10_000, i * 10_000 + 6400)), hasher=hasher)
        for i in range(20)
    ]
    best_alloc = best_free = float("inf")
    for _ in range(rounds):
        for r in reqs:
            t = time.perf_counter()
            ids = pool.get_new_blocks(400)
            best_alloc = min(best_alloc, time.perf_counter() - t)
            pool.cache_full_blocks(r, ids, 0, 400, 0)
            ids.reverse()
            t = time.perf_counter()
            pool.free_blocks(ids)
            best_free = min(best_free, time.perf_counter() - t)
    print(f"allocate 400 blocks  {best_alloc / 400 * 1e9:6.0f} ns per block (best of {rounds})")
    print(f"free 400 blocks      {best_free / 400 * 1e9:6.0f} ns per block (best of {rounds})")


if __name__ == "__main__":
    hashing()
    hashing_memo()
    pool_ops()
