#!/usr/bin/env python3
"""pagedkv on the side-by-side harness workload (``kv_workload.py``).

Prints one JSON line (``core_ops_per_s``, ``core_plus_hash_ops_per_s``, ``digest_lookup``,
``digest_alloc``, ...), the same fields as ``vllm_driver.py`` prints for vLLM's manager;
``compare_vllm.py`` runs both alternately and prints the ratios::

    python benchmarks/vllm_compare_adapter.py --repeat 3
    python benchmarks/vllm_compare_adapter.py --preset heavy-eviction
    python benchmarks/vllm_compare_adapter.py --preset mooncake --hash-algo xxhash
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kv_workload  # noqa: E402

#: The harness names vLLM's hash functions; pagedkv runs their CBOR forms (the same bytes
#: as vLLM's ``sha256_cbor`` / ``xxhash_cbor``).
_HASH_ALGOS = {
    "sha256": "sha256_cbor",
    "sha256_cbor": "sha256_cbor",
    "xxhash": "xxhash_cbor",
    "xxhash_cbor": "xxhash_cbor",
}


class PagedKVAdapter:
    """``kv_workload.Adapter`` over :class:`pagedkv.KVCacheManager`."""

    name = "pagedkv"

    def __init__(self, args: Any) -> None:
        from pagedkv import FullAttentionSpec, KVCacheManager, Request

        self._Request = Request
        spec = FullAttentionSpec(
            block_size=args.block_size, num_kv_heads=8, head_size=128, dtype_bytes=2
        )
        self.events = bool(args.kv_events)
        self.mgr = KVCacheManager.from_spec(
            spec,
            num_blocks=args.num_blocks,
            max_model_len=args.max_model_len,
            enable_caching=not args.no_prefix_caching,
            hash_algo=_HASH_ALGOS[args.hash_algo],
            enable_events=self.events,
        )
        self.hasher = self.mgr.hasher

    def make_request(self, spec: Any) -> Any:
        return self._Request(spec.request_id, spec.prompt)

    def hash_prompt(self, req: Any) -> None:
        req.set_hasher(self.hasher)

    def lookup(self, req: Any) -> tuple[Any, int]:
        hit = self.mgr.get_computed_blocks(req)
        return hit, hit.num_computed_tokens

    def lookup_block_ids(self, handle: Any) -> list[int]:
        return list(handle.block_ids[0]) if handle.block_ids else []

    def allocate_prefill(
        self, req: Any, num_new_tokens: int, num_computed_tokens: int, handle: Any
    ) -> list[int] | None:
        out = self.mgr.allocate_slots(req, num_new_tokens, new_computed_blocks=handle)
        return None if out is None else out[0]

    def after_prefill(self, req: Any) -> None:
        req.num_computed_tokens = req.num_tokens

    def append_token(self, req: Any, token: int) -> None:
        req.append_output_tokens(token)

    def allocate_decode(self, req: Any) -> list[int] | None:
        out = self.mgr.allocate_slots(req, 1)
        return None if out is None else out[0]

    def after_decode(self, req: Any) -> None:
        req.num_computed_tokens += 1

    def free(self, req: Any) -> None:
        self.mgr.free(req)

    def take_events(self) -> int:
        if not self.events:
            return -1
        return len(self.mgr.take_events())

    def num_free_blocks(self) -> int:
        return self.mgr.num_free_blocks

    def usage(self) -> float:
        return self.mgr.usage

    def extra_stats(self) -> dict[str, Any]:
        st = self.mgr.make_prefix_cache_stats()
        return {
            "prefix_cache_stats": {"requests": st.requests, "queries": st.queries, "hits": st.hits},
            "cached_hash_entries": self.mgr.pool.num_cached_blocks(),
        }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    kv_workload.add_workload_args(ap)
    args = kv_workload.parse_with_preset(ap, argv)
    import pagedkv

    info = {
        "impl": "pagedkv",
        "pagedkv_version": pagedkv.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(kv_workload.run_cli(PagedKVAdapter, args, info)))


if __name__ == "__main__":
    main()
