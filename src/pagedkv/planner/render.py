"""How ``pagedkv plan`` shows a :class:`~pagedkv.planner.api.ModelPlan`: JSON, or tables
(``rich`` when installed, else plain text)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from pagedkv.core.specs import AttentionSpec, KVCacheSpec, MambaSpec
from pagedkv.planner.api import ModelPlan
from pagedkv.planner.plan import KVCachePlan
from pagedkv.planner.units import format_bytes

__all__ = ["as_json", "render_tables"]


# -- JSON ------------------------------------------------------------------------------------


def as_json(report: ModelPlan) -> dict[str, Any]:
    """A JSON-ready description of ``report``."""
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
            "mamba_mixer": spec.mamba_mixer, "state_dtypes": list(spec.state_dtypes),
        },
        "assumptions": {
            "gpu_family": report.gpu.name,
            "attention_backend": report.backend.name,
            "block_size": report.block_size,
            "prefix_caching": report.prefix_caching,
            "async_scheduling": report.async_scheduling,
            "max_num_batched_tokens": report.max_num_batched_tokens,
            "lines": list(report.assumptions),
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


def _model_table(report: ModelPlan) -> _Table:
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
    rows.extend(("assumed", line) for line in report.assumptions)
    return _Table(title="Model", headers=None, rows=tuple(rows))


def _plan_rows(plan: KVCachePlan) -> list[tuple[str, str]]:
    if not plan.groups:
        return [("groups", "none (attention-free model)"), ("num_blocks", "1")]
    unification = plan.page_unification
    padding = (f"{plan.num_padding_layers} padding layers "
               f"({100 * plan.padding_waste_fraction:.2f} % of slots)"
               if plan.num_padding_layers else "none")
    if unification is not None:
        padding += (f"; state page +{unification.state_padding_bytes:,} B "
                    f"({unification.state_padding_pct:.2f} %)")
    page = plan.page_size_bytes or 0
    return [
        ("vLLM would log", plan.vllm_log_line or ""),
        ("block size", f"{plan.block_size} tokens (page {page:,} B)"),
        ("groups x slots", f"{len(plan.groups)} x {plan.group_size}"),
        ("tensors", f"{len(plan.tensors)} x {format_bytes(plan.tensors[0].size_bytes)} = "
                    f"{format_bytes(plan.total_bytes)}"),
        ("num_blocks", f"{plan.num_blocks:,}"),
        ("blocks per request", f"{plan.blocks_per_request:,} at max_model_len "
                               f"{plan.max_model_len:,}"),
        ("max concurrency", f"{plan.max_concurrency or 0.0:,.2f}x (vLLM: num_blocks / "
                            "blocks per request)"),
        ("usable concurrency", f"{plan.usable_concurrency or 0.0:,.2f}x (null block held "
                               "back)"),
        ("GPU KV cache size", f"{plan.kv_cache_size_tokens or 0:,} tokens (vLLM's figure)"),
        ("token slots per group", f"{plan.kv_tokens:,} (pagedkv: usable blocks / groups x "
                                  "block size)"),
        ("bytes per token", f"{plan.bytes_per_token:,}"),
        ("padding", padding),
    ]


def _groups_table(plan: KVCachePlan, title: str) -> _Table:
    def span(names: Sequence[str]) -> str:
        return names[0] if len(names) == 1 else f"{names[0]}, {names[1]} .. {names[-1]} " \
            f"({len(names)})"

    return _Table(
        title=title,
        headers=("group", "kind", "layers", "padding", "blocks/req", "spec", "page B"),
        rows=tuple(
            (str(i), g.spec.kind, span(g.layer_names), str(g.num_padding_layers),
             f"{plan.group_blocks(g):,}", _spec_text(g.spec), f"{g.spec.page_size_bytes:,}")
            for i, g in enumerate(plan.groups)
        ),
    )


def _layers_table(plan: KVCachePlan, title: str) -> _Table:
    group_of, tensor_of = plan.layer_to_group(), plan.layer_to_tensor()
    kinds = {name: g.spec.kind for g in plan.groups for name in g.layer_names}
    order = sorted(group_of, key=lambda name: int(name.rsplit(".", 1)[-1])
                   if name.rsplit(".", 1)[-1].isdigit() else 0)
    return _Table(
        title=title, headers=("layer", "kind", "group", "tensor"),
        rows=tuple((name, kinds[name], str(group_of[name]), str(tensor_of[name]))
                   for name in order),
    )


def _sections(report: ModelPlan, *, brief: bool) -> list[_Table]:
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
    notes = list(report.model.notes)
    everywhere = set.intersection(*(set(plan.notes) for _, plan in report.plans))
    notes.extend(note for note in report.plans[0][1].notes if note in everywhere)
    for label, plan in report.plans:
        prefix = f"{label}: " if len(labels) > 1 else ""
        notes.extend(prefix + note for note in plan.notes if note not in everywhere)
    if notes:
        tables.append(_Table(title="Notes", headers=None,
                             rows=tuple(("-", note) for note in notes)))
    return tables


def render_tables(report: ModelPlan, out: TextIO, *, brief: bool) -> None:
    """Write ``report`` as tables: model and assumptions, plan, groups, layers, notes."""
    tables = _sections(report, brief=brief)
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


