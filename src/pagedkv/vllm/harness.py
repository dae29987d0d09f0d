"""vLLM 0.33 schedulers without a model, for tests, benchmarks and the CI smoke: a
scheduler built the way vLLM's engine builds one (the class from
``SchedulerConfig(scheduler_cls=...).get_scheduler_cls()``), synthetic requests with
shared prefixes, and a step loop whose "model" samples one fixed token per step.

``model_dir`` is a directory holding a model's ``config.json`` (nothing else is read:
no weights, no tokenizer); the repository's ``conformance/data/opt-125m-config.json``
is the public configuration of facebook/opt-125m.

>>> # scheduler = build_scheduler(model_dir, "pagedkv.vllm.PagedKVScheduler",
>>> #                             async_scheduling=False, num_blocks=400)
>>> # trace = run(scheduler, make_requests(10))
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK_SIZE = 16


def model_dir(config_json: Path, where: Path) -> str:
    """A model directory under ``where`` holding only ``config_json`` as config.json."""
    d = where / "model"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config_json, d / "config.json")
    return str(d)


def build_scheduler(model: str, scheduler_cls: Any, *, async_scheduling: bool,
                    num_blocks: int, window: int | None = 32, max_model_len: int = 2048,
                    max_num_seqs: int = 8, max_num_batched_tokens: int = 256,
                    enable_caching: bool = True, log_stats: bool = True,
                    kv_events: bool = False, mamba: bool = False,
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
        MambaSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=model, dtype="float16", seed=0,
                        skip_tokenizer_init=True, max_model_len=max_model_len)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs,
                            max_num_batched_tokens=max_num_batched_tokens,
                            max_model_len=max_model_len, enable_chunked_prefill=True,
                            async_scheduling=async_scheduling, watermark=0.0,
                            is_encoder_decoder=False, scheduler_cls=scheduler_cls)
    cache = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9,
                        cache_dtype="auto", enable_prefix_caching=enable_caching)
    cache.num_gpu_blocks = num_blocks
    if mamba:
        cache.mamba_cache_mode = "align"
    from vllm.config import KVEventsConfig

    events = KVEventsConfig(enable_kv_cache_events=True, publisher="null") if kv_events else None
    vllm_config = VllmConfig(scheduler_config=sched, model_config=model_config, cache_config=cache,
                             additional_config=additional_config or {},
                             kv_events_config=events)
    full = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    groups = [KVCacheGroupSpec(["full"], full)]
    if window is not None:
        groups.append(KVCacheGroupSpec(["swa"], SlidingWindowSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32,
            sliding_window=window)))
    if mamba:
        groups.append(KVCacheGroupSpec(["mamba"], MambaSpec(
            block_size=BLOCK_SIZE, shapes=((1, 1),), dtypes=(torch.float32,),
            mamba_cache_mode="align")))
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    register_all_kvcache_specs(vllm_config)
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=vllm_config, kv_cache_config=kv, block_size=BLOCK_SIZE,
               log_stats=log_stats, structured_output_manager=StructuredOutputManager(vllm_config))


def make_requests(n: int, *, shared: int = 48, seed: int = 0, max_tokens: int = 24,
                  num_prefixes: int = 1, tail_tokens: tuple[int, int] = (8, 60),
                  extra_args: dict[str, Any] | None = None,
                  metadata: bool = False) -> list[Any]:
    """``n`` requests, each starting with one of ``num_prefixes`` shared prefixes of
    ``shared`` tokens, then a random tail (sha256 block hashes, as vLLM's default).
    ``metadata``: every third request has a LoRA adapter, every fourth a cache salt,
    every request a session id (what KV events carry)."""
    import random

    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 50000) for _ in range(shared)] for _ in range(num_prefixes)]
    out = []
    for i in range(n):
        prefix = prefixes[rng.randrange(num_prefixes)]
        tail = [rng.randrange(1, 50000) for _ in range(rng.randrange(*tail_tokens))]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args)
        meta: dict[str, Any] = {}
        if metadata:
            from vllm.lora.request import LoRARequest

            meta["session_id"] = f"session-{i % 3}"
            if i % 3 == 0:
                meta["lora_request"] = LoRARequest(lora_name="sql", lora_int_id=1,
                                                   lora_path="/adapters/sql")
            if i % 4 == 1:
                meta["cache_salt"] = f"tenant-{i % 2}"
        out.append(Request(request_id=f"r{i}", prompt_token_ids=prefix + tail,
                           sampling_params=params, pooling_params=None, block_hasher=hasher,
                           **meta))
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


def schedule(scheduler: Any, step_index: int) -> tuple[Any, Any]:
    """``schedule()`` and the model output the step will produce: one sampled token
    (``1000 + step_index``) per request whose scheduled tokens reach the end of its tokens
    (a prefill chunk short of the end samples nothing)."""
    from vllm.v1.outputs import ModelRunnerOutput

    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    reqs = scheduler.requests
    sampled = [[] if reqs[r].num_computed_tokens < reqs[r].num_tokens else [1000 + step_index]
               for r in ids]
    mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                            sampled_token_ids=sampled)
    return out, mro


def step(scheduler: Any, step_index: int) -> Any:
    """One engine step with no model: :func:`schedule`, then ``update_from_output()``.
    Returns the ``SchedulerOutput``."""
    out, mro = schedule(scheduler, step_index)
    scheduler.update_from_output(out, mro)
    return out


def run(scheduler: Any, requests: list[Any], max_steps: int = 100_000,
        overlap: bool = False) -> Trace:
    """Adds ``requests`` and steps ``scheduler`` until every request finished; the trace
    of what it scheduled and, after each step, the free blocks and every live request's
    block tables. ``overlap``: as vLLM's engine core runs an async scheduler, the next
    step is scheduled before the previous one's output is processed (one step in flight:
    requests count its tokens as computed, ``num_in_flight_tokens``)."""
    for r in requests:
        scheduler.add_request(r)
    trace = Trace()
    kv = scheduler.kv_cache_manager
    pending: tuple[Any, Any] | None = None
    for i in range(max_steps):
        if not scheduler.has_requests() and pending is None:
            return trace
        now = schedule(scheduler, i) if scheduler.has_requests() else None
        if now is not None:
            trace.record(now[0])
        if not overlap:
            pending, now = now, None
        if pending is not None:
            scheduler.update_from_output(*pending)
        pending = now
        # What the step left held: free blocks and every live request's tables (window
        # blocks freed too early or too late show here first).
        trace.steps.append({"free_blocks": kv.block_pool.get_num_free_blocks(),
                            "tables": {rid: kv.get_block_ids(rid)
                                       for rid in sorted(scheduler.requests)}})
    raise AssertionError(f"requests still unfinished after {max_steps} steps")
