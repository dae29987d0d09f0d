"""``pagedkv plan``: a model + GPU memory -> KV-cache plan, as tables or JSON.

A thin layer over :mod:`pagedkv.planner`. Wiring (done by ``pagedkv.cli``)::

    subparsers = parser.add_subparsers()
    add_parser(subparsers)          # registers "plan" with func=run
    args = parser.parse_args()
    sys.exit(args.func(args))

Exit codes: 0 success; 2 usage errors (argparse); 1 invalid input (bad config file,
negative memory, TP not dividing heads, not enough memory), reported as one line on stderr.
Tables use ``rich`` when it is installed (``pip install 'pagedkv[cli]'``), else plain text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pagedkv.errors import ConfigError, InvalidArgumentError, PagedKVError
from pagedkv.planner.hf_config import KV_DTYPE_BYTES, ModelSpec, load_config, model_spec_from_config
from pagedkv.planner.layer_file import is_layer_file, load_layer_file, parse_layer_file
from pagedkv.planner.plan import (
    DEFAULT_KERNEL_BLOCK_ALIGNMENT,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    KVCachePlan,
    plan_kv_cache,
)
from pagedkv.planner.units import format_bytes, parse_bytes
from pagedkv.planner.weights import (
    WEIGHT_DTYPE_BYTES,
    MemoryBudget,
    WeightEstimate,
    estimate_weights,
    kv_cache_budget,
)
from pagedkv.specs import AttentionSpec, KVCacheSpec, MambaSpec

__all__ = ["add_parser", "run"]

_DEFAULT_ACTIVATION_RESERVE = "2GiB"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``plan`` subcommand on ``subparsers`` (an argparse sub-parsers action)
    with ``func=run``; returns the new parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="plan the KV cache of a model on a GPU",
        description=(
            "Lay out the KV cache of MODEL on one GPU (per tensor-parallel rank): groups, "
            "block size, KV tokens, max concurrency, padding, and the layer -> group -> "
            "tensor table. MODEL is a path to a Hugging Face config.json, a layer-spec "
            "file (JSON/YAML), or a bundled config name such as Llama-3.1-8B."
        ),
    )
    parser.add_argument("model", metavar="MODEL",
                        help="config.json path, layer-spec file, or bundled config name")
    memory = parser.add_mutually_exclusive_group(required=True)
    memory.add_argument("--gpu-memory", metavar="SIZE",
                        help="memory of one GPU (80GB, 80GiB, 81920MiB or bytes); KV gets "
                        "what utilization leaves after estimated weights and activations")
    memory.add_argument("--kv-cache-memory", metavar="SIZE",
                        help="bytes for the KV cache per GPU (bypasses the weights estimate)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9, metavar="FRACTION",
                        help="share of GPU memory the engine may use (default 0.9)")
    parser.add_argument("--activation-reserve", default=_DEFAULT_ACTIVATION_RESERVE,
                        metavar="SIZE", help="memory kept for activations and runtime "
                        f"(default {_DEFAULT_ACTIVATION_RESERVE})")
    parser.add_argument("--tp", type=int, default=1, metavar="N",
                        help="tensor-parallel size (default 1)")
    parser.add_argument("--kv-dtype", choices=["auto", *KV_DTYPE_BYTES], default="auto",
                        help="KV-cache dtype (default auto: the model's dtype)")
    parser.add_argument("--weight-dtype", choices=["auto", *WEIGHT_DTYPE_BYTES],
                        default="auto", help="weight storage type for the estimate "
                        "(default auto: quantization_config, else torch_dtype)")
    parser.add_argument("--max-model-len", type=int, metavar="TOKENS",
                        help="longest request (default: the config's max_position_embeddings)")
    parser.add_argument("--max-num-batched-tokens", type=int, metavar="TOKENS",
                        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                        help="tokens per scheduling step; windowed layers hold this many "
                        f"beyond the window (default {DEFAULT_MAX_NUM_BATCHED_TOKENS})")
    parser.add_argument("--block-size", type=int, default=16, metavar="TOKENS",
                        help="tokens per block (default 16; grown for Mamba hybrids)")
    parser.add_argument("--kernel-block-alignment", type=int, metavar="TOKENS",
                        default=DEFAULT_KERNEL_BLOCK_ALIGNMENT,
                        help="a grown block size is a multiple of this (default 16)")
    hybrid = parser.add_mutually_exclusive_group()
    hybrid.add_argument("--no-hybrid", action="store_true",
                        help="hybrid allocator off: cost windowed layers as full attention")
    hybrid.add_argument("--compare-hybrid", action="store_true",
                        help="show the plan with the hybrid allocator on and off side by side")
    parser.add_argument("--num-blocks", type=int, metavar="N",
                        help="override the number of blocks")
    parser.add_argument("--brief", action="store_true", help="omit the per-layer table")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=run)
    return parser


# -- building the report ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Report:
    model: ModelSpec
    source: str
    weights: WeightEstimate | None
    budget: MemoryBudget | None
    kv_cache_bytes: int
    plans: tuple[tuple[str, KVCachePlan], ...]
    notes: tuple[str, ...] = field(default=())


def _positive(value: int | None, flag: str) -> None:
    if value is not None and value <= 0:
        raise InvalidArgumentError(f"{flag} must be a positive integer, got {value}")


def _load_model(args: argparse.Namespace) -> tuple[ModelSpec, str, WeightEstimate | None]:
    """The model's specs, its source, and (with --gpu-memory) its weights estimate."""
    path = Path(args.model)
    needs_weights = args.gpu_memory is not None
    if path.is_file() and is_layer_file(path):
        loaded = load_layer_file(path, block_size=args.block_size)
        return loaded.spec, str(path), _layer_file_weights(loaded.num_parameters,
                                                           loaded.weight_dtype, args)
    config, source, name = load_config(args.model)
    if is_layer_file(path, config):
        loaded = parse_layer_file(config, source=source, block_size=args.block_size)
        return loaded.spec, source, _layer_file_weights(loaded.num_parameters,
                                                        loaded.weight_dtype, args)
    spec = model_spec_from_config(config, name=name, source=source, tp_size=args.tp,
                                  kv_dtype=args.kv_dtype, block_size=args.block_size)
    weights = (estimate_weights(config, source=source, tp_size=args.tp,
                                weight_dtype=args.weight_dtype) if needs_weights else None)
    return spec, source, weights


def _layer_file_weights(num_parameters: int | None, file_dtype: str,
                        args: argparse.Namespace) -> WeightEstimate | None:
    if args.gpu_memory is None:
        return None
    if num_parameters is None:
        raise ConfigError(
            f"{args.model}: the layer-spec file gives no num_parameters, so weights cannot "
            "be estimated; add it to the file or pass --kv-cache-memory"
        )
    dtype = file_dtype if args.weight_dtype == "auto" else args.weight_dtype
    return WeightEstimate(num_parameters=num_parameters, weight_dtype=dtype, tp_size=args.tp)


def _build(args: argparse.Namespace) -> _Report:
    for value, flag in ((args.tp, "--tp"), (args.block_size, "--block-size"),
                        (args.max_model_len, "--max-model-len"),
                        (args.max_num_batched_tokens, "--max-num-batched-tokens"),
                        (args.kernel_block_alignment, "--kernel-block-alignment"),
                        (args.num_blocks, "--num-blocks")):
        _positive(value, flag)
    spec, source, weights = _load_model(args)
    budget: MemoryBudget | None = None
    if args.kv_cache_memory is not None:
        kv_bytes = parse_bytes(args.kv_cache_memory, what="--kv-cache-memory")
    else:
        assert weights is not None
        budget = kv_cache_budget(
            gpu_memory_bytes=parse_bytes(args.gpu_memory, what="--gpu-memory"),
            utilization=args.gpu_memory_utilization,
            weight_bytes=weights.weight_bytes_per_rank,
            activation_reserve_bytes=parse_bytes(args.activation_reserve,
                                                 what="--activation-reserve"),
        )
        kv_bytes = budget.kv_cache_bytes
        if kv_bytes <= 0:
            raise ConfigError(
                f"{spec.name}: weights ({format_bytes(weights.weight_bytes_per_rank)} per "
                f"rank) and the activation reserve "
                f"({format_bytes(budget.activation_reserve_bytes)}) exceed the usable "
                f"{format_bytes(budget.usable_bytes)} of GPU memory; use more tensor "
                "parallelism, lower-precision weights, or --kv-cache-memory"
            )
    max_model_len = args.max_model_len or spec.max_position_embeddings
    if max_model_len is None:
        raise ConfigError(f"{source}: no max_position_embeddings; pass --max-model-len")
    modes = [("hybrid on", True), ("hybrid off", False)] if args.compare_hybrid else \
        [("hybrid off", False)] if args.no_hybrid else [("hybrid on", True)]
    plans = tuple(
        (label, plan_kv_cache(
            spec.layer_to_spec, available_bytes=kv_bytes, max_model_len=max_model_len,
            max_num_batched_tokens=args.max_num_batched_tokens, hybrid=hybrid,
            num_blocks=args.num_blocks, kernel_block_alignment=args.kernel_block_alignment,
            model_name=spec.name,
        ))
        for label, hybrid in modes
    )
    return _Report(model=spec, source=source, weights=weights, budget=budget,
                   kv_cache_bytes=kv_bytes, plans=plans, notes=spec.notes)


def run(args: argparse.Namespace, *, stdout: TextIO | None = None,
        stderr: TextIO | None = None) -> int:
    """Run ``pagedkv plan`` for parsed ``args``; returns the exit code (0 or 1).

    Invalid input is reported as one line on ``stderr`` (default ``sys.stderr``).
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        report = _build(args)
    except (PagedKVError, OSError) as exc:
        print(f"pagedkv plan: error: {exc}", file=err)
        return 1
    if args.json:
        json.dump(_as_json(report), out, indent=2)
        out.write("\n")
    else:
        _render(_sections(report, brief=args.brief), out)
    return 0


# -- JSON ------------------------------------------------------------------------------------


def _as_json(report: _Report) -> dict[str, Any]:
    spec = report.model
    memory: dict[str, Any] = {"kv_cache_bytes": report.kv_cache_bytes}
    if report.budget is not None and report.weights is not None:
        memory.update(
            gpu_memory_bytes=report.budget.gpu_memory_bytes,
            gpu_memory_utilization=report.budget.utilization,
            num_parameters=report.weights.num_parameters,
            weight_dtype=report.weights.weight_dtype,
            weight_bytes_per_rank=report.weights.weight_bytes_per_rank,
            activation_reserve_bytes=report.budget.activation_reserve_bytes,
        )
    return {
        "model": {
            "name": spec.name, "model_type": spec.model_type, "source": report.source,
            "tp_size": spec.tp_size, "kv_dtype": spec.kv_dtype,
            "num_hidden_layers": spec.num_hidden_layers,
            "kind_to_num_layers": spec.kind_to_num_layers,
            "bytes_per_token": spec.bytes_per_token, "notes": list(spec.notes),
        },
        "memory": memory,
        "plans": {label.replace(" ", "_"): plan.as_dict() for label, plan in report.plans},
    }


# -- tables ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Table:
    title: str
    headers: tuple[str, ...] | None  # None: key/value rows
    rows: tuple[tuple[str, ...], ...]


def _spec_text(spec: KVCacheSpec) -> str:
    if isinstance(spec, MambaSpec):
        return f"state {spec.state_bytes:,} B"
    assert isinstance(spec, AttentionSpec)
    text = f"{spec.num_kv_heads} KV heads x {spec.head_size}, {spec.dtype_bytes} B"
    for label, attr in (("window", "sliding_window"), ("chunk", "attention_chunk_size")):
        value = getattr(spec, attr, None)
        if value is not None:
            text += f", {label} {value:,}"
    return text


def _model_table(report: _Report) -> _Table:
    spec = report.model
    kinds = ", ".join(f"{n} {kind}" for kind, n in spec.kind_to_num_layers.items())
    rows = [
        ("model", f"{spec.name} ({spec.model_type}; {report.source})"),
        ("layers", f"{spec.num_hidden_layers} ({kinds})"),
        ("per rank", f"TP {spec.tp_size}, KV dtype {spec.kv_dtype}, "
                     f"{spec.bytes_per_token:,} KV bytes per token"),
    ]
    if report.weights is not None and report.budget is not None:
        w, b = report.weights, report.budget
        rows.append(("weights", f"{w.num_parameters / 1e9:,.2f} B params x "
                     f"{w.bytes_per_parameter:g} B ({w.weight_dtype}) / TP {w.tp_size} = "
                     f"{format_bytes(w.weight_bytes_per_rank)} per rank"))
        rows.append(("memory", f"{format_bytes(b.gpu_memory_bytes)} x {b.utilization:g} - "
                     f"weights {format_bytes(b.weight_bytes)} - activations "
                     f"{format_bytes(b.activation_reserve_bytes)} = "
                     f"{format_bytes(report.kv_cache_bytes)} for KV"))
    else:
        rows.append(("memory", f"{format_bytes(report.kv_cache_bytes)} for KV "
                     "(--kv-cache-memory)"))
    return _Table(title="Model", headers=None, rows=tuple(rows))


def _plan_rows(plan: KVCachePlan) -> list[tuple[str, str]]:
    if not plan.groups:
        return [("groups", "none (attention-free model)"), ("num_blocks", "1")]
    concurrency = plan.max_concurrency or 0.0
    unification = plan.page_unification
    padding = (f"{plan.num_padding_layers} padding layers "
               f"({100 * plan.padding_waste_fraction:.2f} % of slots)"
               if plan.num_padding_layers else "none")
    if unification is not None:
        padding += (f"; state page +{unification.state_padding_bytes:,} B "
                    f"({unification.state_padding_pct:.2f} %)")
    page = plan.page_size_bytes or 0
    return [
        ("block size", f"{plan.block_size} tokens (page {page:,} B)"),
        ("groups x slots", f"{len(plan.groups)} x {plan.group_size}"),
        ("tensors", f"{len(plan.tensors)} x {format_bytes(plan.tensors[0].size_bytes)} = "
                    f"{format_bytes(plan.total_bytes)}"),
        ("num_blocks", f"{plan.num_blocks:,}"),
        ("KV tokens", f"{plan.kv_tokens:,}"),
        ("bytes per token", f"{plan.bytes_per_token:,}"),
        ("blocks per request", f"{plan.blocks_per_request:,} at max_model_len "
                               f"{plan.max_model_len:,}"),
        ("max concurrency", f"{concurrency:,.2f}x"),
        ("tokens at max_model_len", f"{plan.tokens_at_max_model_len or 0:,}"),
        ("padding", padding),
    ]


def _groups_table(plan: KVCachePlan, title: str) -> _Table:
    def span(names: Sequence[str]) -> str:
        return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"

    return _Table(
        title=title,
        headers=("group", "kind", "layers", "padding", "spec", "page B"),
        rows=tuple(
            (str(i), g.spec.kind, span(g.layer_names), str(g.num_padding_layers),
             _spec_text(g.spec), f"{g.spec.page_size_bytes:,}")
            for i, g in enumerate(plan.groups)
        ),
    )


def _layers_table(plan: KVCachePlan, title: str) -> _Table:
    group_of, tensor_of = plan.layer_to_group(), plan.layer_to_tensor()
    kinds = {name: g.spec.kind for g in plan.groups for name in g.layer_names}
    return _Table(
        title=title, headers=("layer", "kind", "group", "tensor"),
        rows=tuple((name, kinds[name], str(group_of[name]), str(tensor_of[name]))
                   for name in group_of),
    )


def _sections(report: _Report, *, brief: bool) -> list[_Table]:
    tables = [_model_table(report)]
    if len(report.plans) == 1:
        label, plan = report.plans[0]
        tables.append(_Table(title=f"Plan ({label})", headers=None,
                             rows=tuple(_plan_rows(plan))))
    else:
        columns = [dict(_plan_rows(plan)) for _, plan in report.plans]
        keys = list(dict.fromkeys(k for col in columns for k in col))
        tables.append(_Table(
            title="Plan", headers=("", *(label for label, _ in report.plans)),
            rows=tuple((key, *(col.get(key, "") for col in columns)) for key in keys),
        ))
    labels = [label for label, _ in report.plans]
    shown: list[KVCachePlan] = []
    for _, plan in report.plans:
        if not plan.groups or any(p.groups == plan.groups and p.tensors == plan.tensors
                                  for p in shown):
            continue  # the same layout was already shown
        same = [lb for lb, p in report.plans if (p.groups, p.tensors) == (plan.groups,
                                                                            plan.tensors)]
        suffix = f" ({' = '.join(same)})" if len(labels) > 1 else ""
        shown.append(plan)
        tables.append(_groups_table(plan, f"Groups{suffix}"))
        if not brief:
            tables.append(_layers_table(plan, f"Layer -> group -> tensor{suffix}"))
    notes = list(report.notes)
    everywhere = set.intersection(*(set(plan.notes) for _, plan in report.plans))
    notes.extend(note for note in report.plans[0][1].notes if note in everywhere)
    for label, plan in report.plans:
        prefix = f"{label}: " if len(labels) > 1 else ""
        notes.extend(prefix + note for note in plan.notes if note not in everywhere)
    if notes:
        tables.append(_Table(title="Notes", headers=None,
                             rows=tuple(("-", note) for note in notes)))
    return tables


def _render(tables: Sequence[_Table], out: TextIO) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        _render_plain(tables, out)
        return
    console = Console(file=out, width=120, soft_wrap=False)
    for t in tables:
        table = Table(title=t.title, title_justify="left", show_header=t.headers is not None)
        for header in t.headers or ("", ""):
            table.add_column(header, overflow="fold")
        for row in t.rows:
            table.add_row(*row)
        console.print(table)


def _render_plain(tables: Sequence[_Table], out: TextIO) -> None:
    for t in tables:
        out.write(f"{t.title}\n")
        rows = ([t.headers] if t.headers else []) + list(t.rows)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for n, row in enumerate(rows):
            cells = (cell.ljust(w) for cell, w in zip(row, widths, strict=True))
            out.write(("  " + "  ".join(cells)).rstrip() + "\n")
            if n == 0 and t.headers:
                out.write("  " + "  ".join("-" * w for w in widths) + "\n")
        out.write("\n")
