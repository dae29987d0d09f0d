"""``pagedkv plan``: a model + GPU memory -> KV-cache plan, as tables or JSON. Without a
memory flag the GPU's own memory is assumed (:data:`DEFAULT_GPU_MEMORY`) and said so.

Parse -> :func:`pagedkv.planner.plan_model` -> render (:mod:`pagedkv.planner.render`).
Wiring (done by ``pagedkv.cli``)::

    subparsers = parser.add_subparsers()
    add_parser(subparsers)          # registers "plan" with func=run
    args = parser.parse_args()
    sys.exit(args.func(args))

Exit codes: 0 success; 2 usage errors (unknown flag, missing or malformed argument: one
line, from ``pagedkv.cli.OneLineParser``); 1 invalid input (bad config file, negative
memory, TP not dividing heads, not enough memory): one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, TextIO

from pagedkv.cli_args import number_arg
from pagedkv.errors import InvalidArgumentError, PagedKVError
from pagedkv.planner.api import plan_model
from pagedkv.planner.backends import BACKENDS, GPU_ALIASES
from pagedkv.planner.model_spec import KV_DTYPE_BYTES, STATE_DTYPE_NAMES
from pagedkv.planner.render import as_json, render_tables
from pagedkv.planner.units import parse_bytes
from pagedkv.planner.weights import WEIGHT_DTYPE_BYTES

__all__ = ["add_parser", "run"]

_DEFAULT_ACTIVATION_RESERVE = "2GiB"

#: The memory of one GPU of each ``--gpu`` name, used when neither ``--gpu-memory`` nor
#: ``--kv-cache-memory`` is given (nominal sizes: H100 and A100 80 GiB, H200 141 GiB).
DEFAULT_GPU_MEMORY: dict[str, tuple[str, str]] = {
    "h100": ("80GiB", "an H100"), "hopper": ("80GiB", "an H100"),
    "h200": ("141GiB", "an H200"), "a100": ("80GiB", "an 80 GB A100"),
    "ampere": ("80GiB", "an 80 GB A100"),
}

#: A bare number below this many bytes given as a GPU / KV memory size is a forgotten unit.
_SMALLEST_BARE_SIZE = 1 << 20

#: Values that start with ``-`` and a digit (``-1GiB``) are taken as values, so that a
#: negative size is rejected with a message instead of argparse's "expected one argument".
_NEGATIVE_VALUE = re.compile(r"^-\d")


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
    # "-1GiB" read as a value (to be rejected with a message), not as an unknown option.
    setattr(parser, "_negative_number_matcher", _NEGATIVE_VALUE)  # noqa: B010
    parser.add_argument("model", metavar="MODEL",
                        help="config.json path or folder, layer-spec file, or bundled name")
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument("--gpu-memory", metavar="SIZE",
                        help="memory of one GPU (80GiB, 80G, 80GB, 81920MiB); KV gets what "
                        "utilization leaves after estimated weights and activations "
                        "(default: the --gpu's, 80GiB for h100/a100, 141GiB for h200)")
    memory.add_argument("--kv-cache-memory", metavar="SIZE",
                        help="bytes for the KV cache per GPU (bypasses the weights estimate)")
    parser.add_argument("--gpu-memory-utilization",
                        type=number_arg("--gpu-memory-utilization", minimum=0,
                                        minimum_exclusive=True, maximum=1),
                        default=0.9, metavar="FRACTION",
                        help="share of GPU memory the engine may use (default 0.9)")
    parser.add_argument("--activation-reserve", default=_DEFAULT_ACTIVATION_RESERVE,
                        metavar="SIZE", help="memory kept for activations and runtime "
                        f"(default {_DEFAULT_ACTIVATION_RESERVE})")
    parser.add_argument("--gpu", default="h100", choices=sorted(GPU_ALIASES),
                        help="GPU (family): picks the attention backend, its block size and "
                        "the max_num_batched_tokens default (default h100)")
    parser.add_argument("--attention-backend", choices=sorted(BACKENDS), metavar="NAME",
                        help="attention backend instead of vLLM's choice for the GPU "
                        f"({', '.join(sorted(BACKENDS))})")
    parser.add_argument("--tp", type=int, default=1, metavar="N",
                        help="tensor-parallel size (default 1)")
    parser.add_argument("--kv-dtype", choices=["auto", *KV_DTYPE_BYTES], default="auto",
                        help="KV-cache dtype (default auto: the model's dtype)")
    parser.add_argument("--mamba-ssm-cache-dtype", choices=STATE_DTYPE_NAMES, default="auto",
                        help="SSM state dtype of Mamba hybrids (default auto: the family's, "
                        "e.g. float32 for Nemotron-H, else the model dtype)")
    parser.add_argument("--weight-dtype", choices=["auto", *WEIGHT_DTYPE_BYTES],
                        default="auto", help="weight storage type for the estimate "
                        "(default auto: quantization_config, else torch_dtype)")
    parser.add_argument("--max-model-len", type=int, metavar="TOKENS",
                        help="longest request (default and maximum: the config's "
                        "max_position_embeddings)")
    parser.add_argument("--max-num-batched-tokens", type=int, metavar="TOKENS",
                        help="tokens per scheduling step (default: vllm serve's for the GPU, "
                        "8192 on H100/H200, 2048 on A100)")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                        default=True, help="two batches in flight, so windowed layers hold "
                        "2 x max_num_batched_tokens beyond the window (default on)")
    parser.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction,
                        default=True, help="prefix caching; on Mamba hybrids it keeps "
                        "state checkpoints (align mode) and aligns the block size (default on)")
    parser.add_argument("--block-size", type=int, metavar="TOKENS",
                        help="tokens per block (default: the backend's; grown for Mamba "
                        "hybrids)")
    parser.add_argument("--kernel-block-alignment", type=int, metavar="TOKENS",
                        help="a grown block size is a multiple of this (default: the "
                        "backend's, with the Mamba checkpoint alignment)")
    hybrid = parser.add_mutually_exclusive_group()
    hybrid.add_argument("--no-hybrid", action="store_true",
                        help="hybrid allocator off (vLLM's --disable-hybrid-kv-cache-manager)")
    hybrid.add_argument("--compare-hybrid", action="store_true",
                        help="show the plan with the hybrid allocator on and off side by side")
    parser.add_argument("--num-blocks", type=int, metavar="N",
                        help="override the number of blocks (at most what the memory holds)")
    parser.add_argument("--brief", action="store_true", help="omit the per-layer table")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run)
    return parser


def _memory(text: str, flag: str) -> int:
    """``text`` as bytes; a bare number under 1 MiB is taken as a forgotten unit."""
    value = parse_bytes(text, what=flag)
    if text.strip().isdigit() and 0 < value < _SMALLEST_BARE_SIZE:
        raise InvalidArgumentError(
            f"{flag} {text} is {value} bytes; did you mean {text}GiB? Give a unit "
            "(GiB, GB, G, MiB, TiB)"
        )
    return value


def run(args: argparse.Namespace, *, stdout: TextIO | None = None,
        stderr: TextIO | None = None) -> int:
    """Run ``pagedkv plan`` for parsed ``args``; returns the exit code (0 or 1).

    Invalid input is reported as one line on ``stderr`` (default ``sys.stderr``).
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    gpu_memory, note = args.gpu_memory, ""
    if gpu_memory is None and args.kv_cache_memory is None:
        gpu_memory, gpu_name = DEFAULT_GPU_MEMORY[args.gpu.lower()]
        note = (f"GPU memory: {gpu_memory}, {gpu_name}'s (no --gpu-memory or "
                "--kv-cache-memory given)\n")
    try:
        report = plan_model(
            args.model,
            gpu_memory_bytes=None if gpu_memory is None
            else _memory(gpu_memory, "--gpu-memory"),
            kv_cache_bytes=None if args.kv_cache_memory is None
            else _memory(args.kv_cache_memory, "--kv-cache-memory"),
            gpu_memory_utilization=args.gpu_memory_utilization,
            activation_reserve_bytes=parse_bytes(args.activation_reserve,
                                                 what="--activation-reserve"),
            tp_size=_flag_int(args.tp, "--tp") or 1, kv_dtype=args.kv_dtype,
            weight_dtype=args.weight_dtype,
            max_model_len=_flag_int(args.max_model_len, "--max-model-len"),
            max_num_batched_tokens=_flag_int(args.max_num_batched_tokens,
                                             "--max-num-batched-tokens"),
            block_size=_flag_int(args.block_size, "--block-size"), gpu=args.gpu,
            attention_backend=args.attention_backend,
            prefix_caching=args.prefix_caching, async_scheduling=args.async_scheduling,
            hybrid="compare" if args.compare_hybrid else "off" if args.no_hybrid else "on",
            mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype,
            num_blocks=_flag_int(args.num_blocks, "--num-blocks"),
            kernel_block_alignment=_flag_int(args.kernel_block_alignment,
                                             "--kernel-block-alignment"),
        )
    except (PagedKVError, OSError) as exc:
        print(f"pagedkv plan: error: {_one_line(str(exc))}", file=err)
        return 1
    if args.json:
        json.dump(as_json(report), out, indent=2)
        out.write("\n")
    else:  # JSON carries the assumed memory in memory.gpu_memory_bytes
        out.write(note)
        render_tables(report, out, brief=args.brief)
    return 0


def _flag_int(value: int | None, flag: str) -> int | None:
    if value is not None and value <= 0:
        raise InvalidArgumentError(f"{flag} must be a positive integer, got {value}")
    return value


def _one_line(text: str) -> str:
    return " ".join(text.split())
