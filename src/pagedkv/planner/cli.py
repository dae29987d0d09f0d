"""``pagedkv plan``: a model + GPU memory -> KV-cache plan, as tables or JSON. Without a
memory flag the ``--gpu``'s own memory (the GPU table, :mod:`pagedkv.planner.gpus`) is
assumed and said so. Without ``--max-model-len``, a model whose full context does not fit
is planned at the longest that does, and a note says so and what to change.

Parse -> :func:`pagedkv.planner.plan_model` -> render (:mod:`pagedkv.planner.render`).
Wiring (done by ``pagedkv.cli``)::

    subparsers = parser.add_subparsers()
    add_parser(subparsers)          # registers "plan" with func=run
    args = parser.parse_args()
    sys.exit(args.func(args))

Exit codes (the rule of every command, :mod:`pagedkv.cli`): 0 success; 2 a caller's
mistake (unknown flag, malformed or out-of-range value, negative memory, unknown GPU); 1
the plan cannot be made (bad config file, TP not dividing heads, not enough memory): one
line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from pagedkv.cli_args import exit_code, number_arg, whole_arg
from pagedkv.errors import InsufficientMemoryError, PagedKVError
from pagedkv.planner.api import ModelPlan, plan_model
from pagedkv.planner.args import check_size, gpu_arg, size_arg
from pagedkv.planner.backends import BACKENDS
from pagedkv.planner.gpus import DEFAULT_GPU, GPUS, resolve_gpu
from pagedkv.planner.model_spec import KV_DTYPE_BYTES, STATE_DTYPE_NAMES
from pagedkv.planner.render import as_json, render_tables
from pagedkv.planner.weights import WEIGHT_DTYPE_BYTES

__all__ = ["add_parser", "run"]

_DEFAULT_ACTIVATION_RESERVE = "2GiB"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``plan`` subcommand on ``subparsers`` (an argparse sub-parsers action)
    with ``func=run``; returns the new parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="plan the KV cache of a model on a GPU",
        description=(
            "Lay out the KV cache of MODEL on one GPU (per tensor-parallel rank) the way "
            "vLLM 0.33 does at its defaults: groups, block size, the 'GPU KV cache size' "
            "and 'Maximum concurrency' vLLM logs, padding, and the layer -> group -> "
            "tensor table. MODEL is a path to a Hugging Face config.json (or its folder), "
            "a layer-spec file (JSON/YAML), or a bundled config name such as Llama-3.1-8B."
        ),
    )
    parser.add_argument("model", metavar="MODEL",
                        help="config.json path or folder, layer-spec file, or bundled name")
    _add_memory_options(parser)
    parser.add_argument("--gpu", default=DEFAULT_GPU, type=gpu_arg("--gpu"),
                        metavar="NAME|SPEC.json",
                        help=f"the GPU: one of {', '.join(GPUS)}, a family (hopper, ampere, "
                        "blackwell, ada, cdna3) or short name (h100, b200; any case), or a "
                        "JSON spec; picks the attention backend, its block size, the "
                        f"max_num_batched_tokens default and the memory (default {DEFAULT_GPU})")
    parser.add_argument("--attention-backend", choices=sorted(BACKENDS), metavar="NAME",
                        help="attention backend instead of vLLM's choice for the GPU "
                        f"({', '.join(sorted(BACKENDS))})")
    parser.add_argument("--tp", type=whole_arg("--tp", minimum=1), default=1, metavar="N",
                        help="tensor-parallel size (default 1)")
    parser.add_argument("--kv-dtype", choices=["auto", *KV_DTYPE_BYTES], default="auto",
                        help="KV-cache dtype (default auto: the model's dtype)")
    parser.add_argument("--mamba-ssm-cache-dtype", choices=STATE_DTYPE_NAMES, default="auto",
                        help="SSM state dtype of Mamba hybrids (default auto: the family's, "
                        "e.g. float32 for Nemotron-H, else the model dtype)")
    parser.add_argument("--weight-dtype", choices=["auto", *WEIGHT_DTYPE_BYTES],
                        default="auto", help="weight storage type for the estimate "
                        "(default auto: quantization_config, else torch_dtype)")
    parser.add_argument("--max-model-len", type=whole_arg("--max-model-len", minimum=1),
                        metavar="TOKENS",
                        help="longest request (default and maximum: the config's "
                        "max_position_embeddings)")
    parser.add_argument("--max-num-batched-tokens",
                        type=whole_arg("--max-num-batched-tokens", minimum=1),
                        metavar="TOKENS",
                        help="tokens per scheduling step (default: vllm serve's for the GPU, "
                        "8192 on H100/H200, 16384 on B200/MI300X, 2048 on A100/L40S)")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                        default=True, help="two batches in flight, so windowed layers hold "
                        "2 x max_num_batched_tokens beyond the window (default on)")
    parser.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction,
                        default=True, help="prefix caching; on Mamba hybrids it keeps "
                        "state checkpoints (align mode) and aligns the block size (default on)")
    parser.add_argument("--block-size", type=whole_arg("--block-size", minimum=1),
                        metavar="TOKENS",
                        help="tokens per block (default: the backend's; grown for Mamba "
                        "hybrids)")
    parser.add_argument("--kernel-block-alignment",
                        type=whole_arg("--kernel-block-alignment", minimum=1),
                        metavar="TOKENS",
                        help="a grown block size is a multiple of this (default: the "
                        "backend's, with the Mamba checkpoint alignment)")
    hybrid = parser.add_mutually_exclusive_group()
    hybrid.add_argument("--no-hybrid", action="store_true",
                        help="hybrid allocator off (vLLM's --disable-hybrid-kv-cache-manager)")
    hybrid.add_argument("--compare-hybrid", action="store_true",
                        help="show the plan with the hybrid allocator on and off side by side")
    parser.add_argument("--num-blocks", type=whole_arg("--num-blocks", minimum=1),
                        metavar="N",
                        help="override the number of blocks (at most what the memory holds)")
    parser.add_argument("--brief", action="store_true", help="omit the per-layer table")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run)
    return parser


def _add_memory_options(parser: argparse.ArgumentParser) -> None:
    """``--gpu-memory`` or ``--kv-cache-memory``, the utilization and the reserve."""
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument("--gpu-memory", metavar="SIZE", type=size_arg("--gpu-memory"),
                        help="memory of one GPU (80GiB, 80G, 80GB, 81920MiB); KV gets what "
                        "utilization leaves after estimated weights and activations "
                        "(default: the --gpu's, 80GiB for an H100, 141GiB for an H200)")
    memory.add_argument("--kv-cache-memory", metavar="SIZE",
                        type=size_arg("--kv-cache-memory"),
                        help="bytes for the KV cache per GPU (bypasses the weights estimate)")
    parser.add_argument("--gpu-memory-utilization",
                        type=number_arg("--gpu-memory-utilization", minimum=0,
                                        minimum_exclusive=True, maximum=1),
                        default=0.9, metavar="FRACTION",
                        help="share of GPU memory the engine may use (default 0.9)")
    parser.add_argument("--activation-reserve", default=_DEFAULT_ACTIVATION_RESERVE,
                        metavar="SIZE", type=size_arg("--activation-reserve"),
                        help="memory kept for activations and runtime "
                        f"(default {_DEFAULT_ACTIVATION_RESERVE})")


def run(args: argparse.Namespace, *, stdout: TextIO | None = None,
        stderr: TextIO | None = None) -> int:
    """Run ``pagedkv plan`` for parsed ``args``; returns the exit code (0, or 1 / 2 by
    :func:`pagedkv.cli_args.exit_code`).

    A failure is reported as one line on ``stderr`` (default ``sys.stderr``).
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    note = ""
    try:
        gpu_memory = args.gpu_memory
        if gpu_memory is None and args.kv_cache_memory is None:
            gpu = resolve_gpu(args.gpu)
            gpu_memory = gpu.memory
            note = (f"GPU memory: {gpu_memory}, the {gpu.name}'s (no --gpu-memory or "
                    "--kv-cache-memory given)\n")
        report, capped = _plan(args, gpu_memory)
    except (PagedKVError, OSError) as exc:
        print(f"pagedkv plan: error: {_one_line(str(exc))}", file=err)
        return exit_code(exc)
    if args.json:
        data = as_json(report)
        if capped:
            data["notes"] = [capped.strip()]
        json.dump(data, out, indent=2)
        out.write("\n")
    else:  # JSON carries the assumed memory in memory.gpu_memory_bytes
        out.write(note + capped)
        render_tables(report, out, brief=args.brief)
    return 0


def _plan(args: argparse.Namespace, gpu_memory: str | None) -> tuple[ModelPlan, str]:
    """The plan ``args`` ask for, and a note when the model's full context did not fit
    and ``max_model_len`` was capped to what does (only without ``--max-model-len``)."""
    kwargs: dict[str, Any] = dict(
        gpu_memory_bytes=None if gpu_memory is None else check_size(gpu_memory),
        kv_cache_bytes=None if args.kv_cache_memory is None
        else check_size(args.kv_cache_memory),
        gpu_memory_utilization=args.gpu_memory_utilization,
        activation_reserve_bytes=check_size(args.activation_reserve),
        tp_size=args.tp, kv_dtype=args.kv_dtype, weight_dtype=args.weight_dtype,
        max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size, gpu=args.gpu, attention_backend=args.attention_backend,
        prefix_caching=args.prefix_caching, async_scheduling=args.async_scheduling,
        hybrid="compare" if args.compare_hybrid else "off" if args.no_hybrid else "on",
        mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype, num_blocks=args.num_blocks,
        kernel_block_alignment=args.kernel_block_alignment)
    try:
        return plan_model(args.model, **kwargs), ""
    except InsufficientMemoryError as exc:
        fits = exc.max_model_len_that_fits
        if args.max_model_len is not None or fits < 1:
            raise
        kwargs["max_model_len"] = fits
        report = plan_model(args.model, **kwargs)
    full = report.model.max_position_embeddings
    return report, (
        f"max_model_len: {fits:,}, capped: the model's full {full:,} tokens do not fit in "
        f"the KV cache (give --max-model-len N to choose, or a larger --tp or GPU for the "
        "full context)\n")


def _one_line(text: str) -> str:
    return " ".join(text.split())
