#!/usr/bin/env python3
"""pagedkv adapter for the side-by-side harness workload (``kv_workload.py``) with
retention control configured, for ``benchmarks/retention_speed.py``.

``--retention on``: ``CacheConfig(retention=RetentionConfig())`` and nothing asked (every
block at the default priority): the digests must equal vLLM's.
``--retention active``: every request asks for retention (its first
``--system-prompt-len`` tokens at priority 80 for 30 s, the rest at 35, decode tokens at
20) and the first request's system prompt is pinned for an hour with refresh on hit: every
free, eviction and hit goes through the priority levels, timers and pins.

    python benchmarks/retention_adapter.py --retention active --repeat 3
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
from vllm_compare_adapter import PagedKVAdapter  # noqa: E402


class RetentionAdapter(PagedKVAdapter):
    """The plain adapter, on a manager built with retention control."""

    name = "pagedkv-retention"

    def __init__(self, args: Any) -> None:
        from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
        from pagedkv.retention import RequestRetention, RetentionConfig, TokenRangeRetention

        super().__init__(args)
        spec = FullAttentionSpec(block_size=args.block_size, num_kv_heads=8, head_size=128,
                                 dtype_bytes=2)
        self.mgr = KVCacheManager(CacheConfig(
            groups=(spec,), num_blocks=args.num_blocks, max_model_len=args.max_model_len,
            enable_caching=not args.no_prefix_caching, enable_events=self.events,
            retention=RetentionConfig(pin_budget_fraction=0.5),
        ))
        self.hasher = self.mgr.hasher
        self.active = args.retention in ("active", "ranges")
        self.pin = args.retention in ("active", "pins")
        self.retention = RequestRetention(
            ranges=(TokenRangeRetention(token_end=args.system_prompt_len, priority=80,
                                        duration_s=30.0),),
            decode_priority=20,
        )
        self.pinned = False

    def make_request(self, spec: Any) -> Any:
        req = super().make_request(spec)
        if self.active:
            req.retention = self.retention
        return req

    def after_prefill(self, req: Any) -> None:
        super().after_prefill(req)
        if self.pin and not self.pinned:
            assert self.mgr.retention is not None
            self.mgr.retention.pin_prefix(req, ttl_s=3600.0, refresh_on_hit=True,
                                          num_tokens=min(req.num_tokens - 1, 1024))
            self.pinned = True


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--retention", choices=("on", "active", "ranges", "pins"), default="on")
    kv_workload.add_workload_args(ap)
    args = kv_workload.parse_with_preset(ap, argv)
    import pagedkv

    info = {"impl": f"pagedkv-retention-{args.retention}",
            "pagedkv_version": pagedkv.__version__, "python": platform.python_version()}
    out = kv_workload.run_cli(RetentionAdapter, args, info)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
