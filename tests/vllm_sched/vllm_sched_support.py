"""Building vLLM 0.33 schedulers for the tests of :mod:`pagedkv.vllm` (skipped without
vLLM): a local model directory holding the public ``config.json`` of facebook/opt-125m
(``conformance/data/``; no hub, no tokenizer), a two-group layout (full attention + a
sliding window) and a step loop with a scripted model (no forward pass)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_JSON = Path(__file__).resolve().parents[2] / "conformance" / "data" / "opt-125m-config.json"
BLOCK_SIZE = 16


def model_dir(tmp: Path) -> str:
    d = tmp / "opt-125m"
    d.mkdir(exist_ok=True)
    shutil.copyfile(CONFIG_JSON, d / "config.json")
    return str(d)


def build_scheduler(tmp: Path, scheduler_cls: Any, *, async_scheduling: bool,
                    num_blocks: int, window: int | None = 32, max_model_len: int = 1024,
                    enable_caching: bool = True, log_stats: bool = True,
                    additional_config: dict[str, Any] | None = None) -> Any:
    """A scheduler built the way vLLM's engine builds one: the class from
    ``SchedulerConfig(scheduler_cls=...).get_scheduler_cls()``."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=model_dir(tmp), dtype="float16", seed=0,
                        skip_tokenizer_init=True, max_model_len=max_model_len)
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256,
                            max_model_len=max_model_len, enable_chunked_prefill=True,
                            async_scheduling=async_scheduling, watermark=0.0,
                            is_encoder_decoder=False, scheduler_cls=scheduler_cls)
    cache = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9,
                        cache_dtype="auto", enable_prefix_caching=enable_caching)
    cache.num_gpu_blocks = num_blocks
    vllm_config = VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache,
                             additional_config=additional_config or {})
    full = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    groups = [KVCacheGroupSpec(["full"], full)]
    if window is not None:
        groups.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32,
            sliding_window=window)))
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    register_all_kvcache_specs(vllm_config)
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=vllm_config, kv_cache_config=kv, block_size=BLOCK_SIZE,
               log_stats=log_stats, structured_output_manager=StructuredOutputManager(vllm_config))


def make_requests(n: int, *, shared: int = 48, seed: int = 0, max_tokens: int = 24,
                  extra_args: dict[str, Any] | None = None) -> list[Any]:
    """``n`` requests sharing a ``shared``-token prefix (sha256 block hashes)."""
    import random

    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 50000) for _ in range(shared)]
    out = []
    for i in range(n):
        tail = [rng.randrange(1, 50000) for _ in range(rng.randrange(8, 60))]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args)
        out.append(Request(request_id=f"r{i}", prompt_token_ids=prefix + tail,
                           sampling_params=params, pooling_params=None, block_hasher=hasher))
    return out


@dataclass
class Trace:
    """What one scheduler did, step by step."""

    steps: list[dict[str, Any]] = field(default_factory=list)

    def record(self, out: Any) -> None:
        new = {r.req_id: (r.num_computed_tokens, [list(g) for g in r.block_ids])
               for r in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        grown = {rid: None if b is None else [list(g) for g in b]
                 for rid, b in zip(cached.req_ids, cached.new_block_ids, strict=True)}
        self.steps.append({"tokens": dict(sorted(out.num_scheduled_tokens.items())),
                           "new": new, "grown": grown,
                           "preempted": sorted(getattr(out, "preempted_req_ids", None) or ())})


def run(scheduler: Any, requests: list[Any], max_steps: int = 400) -> Trace:
    """Steps ``scheduler`` until every request finished; each scheduled request samples
    one token per step (a fixed function of the step), as a model would."""
    from vllm.v1.outputs import ModelRunnerOutput

    for r in requests:
        scheduler.add_request(r)
    trace = Trace()
    for step in range(max_steps):
        if not scheduler.has_requests():
            return trace
        out = scheduler.schedule()
        trace.record(out)
        ids = list(out.num_scheduled_tokens)
        reqs = scheduler.requests
        # A prefill chunk that does not reach the end of the tokens samples nothing.
        sampled = [[] if reqs[r].num_computed_tokens < reqs[r].num_tokens else [1000 + step]
                   for r in ids]
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        scheduler.update_from_output(out, mro)
    raise AssertionError(f"requests still unfinished after {max_steps} steps")
