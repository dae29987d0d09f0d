#!/usr/bin/env python3
"""pagedkv adapter for the side-by-side harness in ``../shared/bench/vllm_compare``.

Replays the harness's workload through pagedkv and prints the harness's JSON line
(``core_ops_per_s``, ``digest_lookup``, ``digest_alloc``...). Run the vLLM driver with the
same flags right before or after and compare (see ``benchmarks/README.md``)::

    python benchmarks/vllm_compare_adapter.py --repeat 5
    python benchmarks/vllm_compare_adapter.py --num-blocks 1500 --num-system-prompts 8 \\
        --shared-fraction 0.8

``--harness-dir`` points at the harness (default: ``../shared/bench/vllm_compare`` next to
this checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_HARNESS = os.path.normpath(
    os.path.join(HERE, "..", "..", "shared", "bench", "vllm_compare")
)

_HASH_ALGOS = {
    "sha256": "sha256_cbor",
    "sha256_cbor": "sha256_cbor",
    "xxhash": "xxhash_cbor",
    "xxhash_cbor": "xxhash_cbor",
}


class PagedKVAdapter:
    """Drives :class:`pagedkv.KVCacheManager` the way the harness's protocol asks."""

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
        return self._Request(spec.req_id, spec.prompt)

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
            "usable_blocks": self.mgr.pool.num_blocks - 1,
        }


def main(argv: list[str] | None = None) -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--harness-dir", default=DEFAULT_HARNESS)
    known, rest = pre.parse_known_args(argv)
    sys.path.insert(0, known.harness_dir)
    import workload  # the harness module

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--harness-dir", default=DEFAULT_HARNESS)
    workload.add_workload_args(ap)
    ap.add_argument("--pretty", action="store_true", help="indent the JSON")
    args = ap.parse_args(rest)
    import pagedkv

    info = {
        "impl": "pagedkv",
        "pagedkv_version": pagedkv.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    out = workload.run_cli(lambda a, r: PagedKVAdapter(a), args, info)
    print(json.dumps(out, indent=2 if args.pretty else None))


if __name__ == "__main__":
    main()
