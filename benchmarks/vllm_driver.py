#!/usr/bin/env python3
"""vLLM 0.33's own ``KVCacheManager`` on the harness workload (``kv_workload.py``).

Run it with an interpreter that has vLLM installed (``benchmarks/README.md`` shows a
CPU-only install); it prints one JSON line, the same fields as
``vllm_compare_adapter.py`` prints for pagedkv::

    VLLM_PY benchmarks/vllm_driver.py --repeat 3
    VLLM_PY benchmarks/vllm_driver.py --preset heavy-eviction

The manager is driven as vLLM's scheduler drives it for one full-attention group: a
request's block hashes come from vLLM's request block hasher (timed as ``hash_prompt``),
``get_computed_blocks`` plus ``record_prefix_cache_stats`` is the lookup, ``allocate_slots``
with the hit for the prompt and with one token per decode step, ``free`` at the end.
Nothing here is pagedkv code.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kv_workload


class VllmAdapter:
    """``kv_workload.Adapter`` over ``vllm.v1.core.kv_cache_manager.KVCacheManager``."""

    name = "vllm"

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.request import Request, RequestStatus

        self._request_cls = Request
        self._running = RequestStatus.RUNNING
        hash_fn = get_hash_fn_by_name(args.hash_algo)
        init_none_hash(hash_fn)  # the engine core seeds the root hash the same way
        # Only block_size and num_blocks matter to the scheduler-side manager.
        group = KVCacheGroupSpec(
            ["layers.0.self_attn"],
            FullAttentionSpec(block_size=args.block_size, num_kv_heads=8, head_size=128,
                              dtype=torch.bfloat16),
        )
        self.events = bool(args.kv_events)
        self.mgr = KVCacheManager(
            KVCacheConfig(num_blocks=args.num_blocks, kv_cache_tensors=[],
                          kv_cache_groups=[group]),
            max_model_len=args.max_model_len,
            scheduler_block_size=args.block_size,
            hash_block_size=args.block_size,
            enable_caching=not args.no_prefix_caching,
            log_stats=True,
            enable_kv_cache_events=self.events,
        )
        self._hasher = get_request_block_hasher(args.block_size, hash_fn)
        self._params = SamplingParams(max_tokens=1 << 20)

    def make_request(self, spec: kv_workload.BenchRequest) -> Any:
        # No hasher yet: hashing the prompt is timed on its own, in hash_prompt.
        return self._request_cls(request_id=spec.request_id, prompt_token_ids=spec.prompt,
                                 sampling_params=self._params, pooling_params=None,
                                 block_hasher=None)

    def hash_prompt(self, req: Any) -> None:
        req._block_hasher = self._hasher
        req.update_block_hashes()

    def lookup(self, req: Any) -> tuple[Any, int]:
        blocks, hit, _boundary = self.mgr.get_computed_blocks(req)
        self.mgr.record_prefix_cache_stats(req, hit)
        return blocks, hit

    def lookup_block_ids(self, handle: Any) -> list[int]:
        return list(handle.get_block_ids()[0])

    def allocate_prefill(self, req: Any, num_new_tokens: int, num_computed_tokens: int,
                         handle: Any) -> list[int] | None:
        out = self.mgr.allocate_slots(req, num_new_tokens, num_computed_tokens, handle)
        return None if out is None else list(out.get_block_ids()[0])

    def after_prefill(self, req: Any) -> None:
        req.num_computed_tokens = req.num_tokens
        req.status = self._running

    def append_token(self, req: Any, token: int) -> None:
        req.append_output_token_ids(token)

    def allocate_decode(self, req: Any) -> list[int] | None:
        out = self.mgr.allocate_slots(req, 1)
        return None if out is None else list(out.get_block_ids()[0])

    def after_decode(self, req: Any) -> None:
        req.num_computed_tokens += 1

    def free(self, req: Any) -> None:
        self.mgr.free(req)

    def take_events(self) -> int:
        return len(self.mgr.take_events()) if self.events else -1

    def num_free_blocks(self) -> int:
        return int(self.mgr.block_pool.get_num_free_blocks())

    def usage(self) -> float:
        return float(self.mgr.usage)

    def extra_stats(self) -> dict[str, Any]:
        st = self.mgr.make_prefix_cache_stats()
        return {
            "prefix_cache_stats": {"requests": st.requests, "queries": st.queries,
                                   "hits": st.hits},
            "cached_hash_entries": len(self.mgr.block_pool.cached_block_hash_to_block),
        }


def main(argv: list[str] | None = None) -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    kv_workload.add_workload_args(ap)
    args = kv_workload.parse_with_preset(ap, argv)
    import vllm

    logging.getLogger("vllm").setLevel(logging.WARNING)
    info = {"impl": "vllm", "vllm_version": vllm.__version__,
            "python": platform.python_version(), "cpu_count": os.cpu_count()}
    print(json.dumps(kv_workload.run_cli(VllmAdapter, args, info)))


if __name__ == "__main__":
    main()
