"""Rendering a :class:`~pagedkv.sim.summary.SimReport`: a terminal table (``rich`` when
installed, plain text otherwise) with the verdict line last. Plots are
:mod:`pagedkv.sim.plots`; the progress bar :mod:`pagedkv.sim.progress`.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from pagedkv.sim.host_sweep import host_sections, host_sweep_table
from pagedkv.sim.progress import ProgressReporter, rich_console
from pagedkv.sim.summary import SimReport, rejected_reasons

__all__ = ["ProgressReporter", "clock_line", "print_report", "render_text", "verdict_line"]


#: The latency figures a report prints, in order.
STATS = ("mean", "p50", "p90", "p99")


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _sec(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:.1f} ms"


def clock_line(s: dict[str, Any]) -> str | None:
    """``clock: roofline: <model> TP <n> on <gpu> (constants <set>); time: 71 % weights,
    ...; dominant: weights`` (engine mode), else None."""
    c = s.get("clock")
    if not c:
        return None
    line = f"clock: {c['description']}"
    terms = c.get("terms_s")
    if terms:
        total = sum(terms.values()) or 1.0
        parts = [f"{100 * v / total:.0f} % {k}" for k, v in
                 sorted(terms.items(), key=lambda kv: -kv[1]) if v > 0]
        line += (f"; decode step {c['decode_step_s'] * 1e3:.1f} ms at the mean context; "
                 f"time: {', '.join(parts)}; dominant: {c['dominant']}")
    return line


def _rejected(s: dict[str, Any]) -> str:
    """``99  (99 longer than max_model_len 40,960, ...)``: the count, then the reasons."""
    total = s["rejected_requests"]
    if not total:
        return "0"
    reasons = s.get("rejected_by_reason") or {}
    text = rejected_reasons(total, reasons.get("over_max_model_len", 0))
    limit = s["settings"].get("max_model_len")
    if limit is not None:
        text = text.replace("max_model_len", f"max_model_len {limit:,}")
    return f"{total:,}  ({text})"


def _cap(tokens: int | None) -> str:
    return "unlimited" if tokens is None else f"{tokens:,}"


def _rows(s: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    cache = [
        ("hit rate (all requests)",
         f"{_pct(s['hit_rate'])}  ({s['hit_tokens']:,} of {s['prompt_tokens']:,} prompt "
         "tokens)"),
        (f"hit rate after warm-up (requests {s['warmup_requests']}+)",
         _pct(s["hit_rate_after_warmup"])),
    ]
    if s["belady_hit_rate"] is not None:
        cache.append(("Belady optimum at this capacity",
                      f"{_pct(s['belady_hit_rate'])}  (after warm-up "
                      f"{_pct(s['belady_hit_rate_after_warmup'])})"))
    if s["infinite_cache_hit_rate"] is not None:
        cache.append(("infinite-cache ceiling",
                      f"{_pct(s['infinite_cache_hit_rate'])}  (after warm-up "
                      f"{_pct(s['infinite_cache_hit_rate_after_warmup'])})"))
    if s["ideal_hit_rate"] is not None:
        cache.append(("analytic ideal (generator)", _pct(s["ideal_hit_rate"])))
    cache.append(("evicted blocks", f"{s['evicted_blocks']:,}"))
    windows = s["hit_rate_windows"]
    if windows:
        cache.append(("hit rate over time (windows)",
                      " ".join(f"{100 * w['hit_rate']:.0f}" for w in windows) + "  %"))
    sections = [("Prefix cache", cache)]
    if s["mode"] == "engine":
        lat = s["latency_s"]
        q, t = lat.get("queue_delay_s", {}), lat.get("ttft_s", {})
        sections.append(("Engine", [
            ("KV usage mean / max", f"{_pct(s['usage_mean'])} / {_pct(s['usage_max'])}"),
            ("steps / simulated time",
             f"{s['steps']:,} / {_sec(s['simulated_s'])}"),
            ("preemptions", f"{s['preemptions']:,}  (re-lookups hit "
                            f"{s['preempted_relookup_hit_tokens']:,} of "
                            f"{s['preempted_relookup_tokens']:,} tokens)"),
            ("rejected", _rejected(s)),
            ("queue delay mean / p50 / p90 / p99", " / ".join(_sec(q.get(k)) for k in STATS)),
            ("TTFT mean / p50 / p90 / p99", " / ".join(_sec(t.get(k)) for k in STATS)),
            ("TPOT mean / p50 / p90 / p99",
             " / ".join(_ms(lat.get("tpot_s", {}).get(k)) for k in STATS)),
            ("end-to-end mean / p50 / p90 / p99",
             " / ".join(_sec(lat.get("e2e_s", {}).get(k)) for k in STATS)),
            ("output tokens/s", "—" if s.get("output_tokens_per_s") is None
             else f"{s['output_tokens_per_s']:,.0f}"),
        ]))
    sections.extend(host_sections(s))
    if s.get("retention"):
        from pagedkv.sim.retention_support import render_rows

        sections.append(render_rows(s["retention"]))
    return sections


def _header(s: dict[str, Any]) -> str:
    cap = s["settings"]["capacity"]
    groups = cap["groups"]
    sem = "" if s["semantics"] == "vllm" else f", {s['semantics']} semantics"
    if len(groups) > 1:
        kinds: dict[str, int] = {}
        for g in groups:
            kinds[g] = kinds.get(g, 0) + 1
        size = (f"{s['num_blocks'] - 1:,} blocks shared by {len(groups)} KV-cache groups: "
                + ", ".join(f"{n} × {g}" if n > 1 else g for g, n in kinds.items()))
    else:
        size = (f"{s['num_blocks'] - 1:,} blocks = {s['capacity_tokens']:,} tokens of KV cache"
                + (f", {groups[0]}" if groups and not groups[0].startswith("full") else ""))
    return (
        f"pagedkv simulate — {s['description']}\n"
        f"mode {s['mode']}{sem}, block size {s['block_size']}, {size}; replayed in "
        f"{s['wall_s']:.1f} s"
    )


def verdict_line(s: dict[str, Any]) -> str | None:
    """``verdict: saturated — evidence. advice`` (engine mode), else None."""
    v = s.get("verdict")
    if not v:
        return None
    line = f"verdict: {v['state'].upper()} — {v['evidence']}"
    return line + (f". {v['advice']}" if v["advice"] else "")


def _sweep_lines(s: dict[str, Any]) -> list[list[str]]:
    return [
        [_cap(r["capacity_tokens"]), _pct(r["lru"]), _pct(r["lru_after_warmup"]),
         _pct(r["belady"]), _pct(r["belady_after_warmup"]), _pct(r["infinite"]),
         _pct(r["infinite_after_warmup"])]
        for r in s.get("capacity_sweep", ())
    ]


_SWEEP_HEAD = ["capacity (tokens)", "LRU", "LRU after warm-up", "Belady",
               "Belady after warm-up", "infinite", "infinite after warm-up"]


def render_text(report: SimReport) -> str:
    """The report as plain text (no ``rich``)."""
    s = report.to_dict()
    lines = [_header(s), ""]
    for title, rows in _rows(s):
        lines.append(title)
        width = max(len(k) for k, _ in rows)
        lines.extend(f"  {k.ljust(width)}  {v}" for k, v in rows)
        lines.append("")
    sweep = _sweep_lines(s)
    if sweep:
        lines.append("Hit rate vs capacity (pure-cache mode)")
        table = [_SWEEP_HEAD, *sweep]
        widths = [max(len(r[i]) for r in table) for i in range(len(_SWEEP_HEAD))]
        for r in table:
            lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        lines.append("")
    host = host_sweep_table(s)
    if host:
        title, head, host_rows = host
        cells = [head, *host_rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
        lines.append(title)
        lines.extend("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
                     for r in cells)
        lines.append("")
    clock = clock_line(s)
    if clock:
        lines.append(clock)
    verdict = verdict_line(s)
    if verdict:
        lines.append(verdict)
    return "\n".join(lines).rstrip() + "\n"


def print_report(report: SimReport, *, stream: TextIO | None = None, plain: bool = False
                 ) -> None:
    """Print the report: a ``rich`` table when importable (and not ``plain``), else text."""
    out = stream or sys.stdout
    s = report.to_dict()
    if not plain:
        try:
            from rich.table import Table
        except ImportError:
            plain = True
    if plain:
        out.write(render_text(report))
        return
    console = rich_console(out)
    console.print(_header(s), highlight=False)
    for title, rows in _rows(s):
        table = Table(title=title, title_justify="left", show_header=False, box=None,
                      padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for k, v in rows:
            table.add_row(k, v)
        console.print(table)
    sweep = _sweep_lines(s)
    if sweep:
        table = Table(title="Hit rate vs capacity (pure-cache mode)", title_justify="left")
        for h in _SWEEP_HEAD:
            table.add_column(h, justify="right")
        for r in sweep:
            table.add_row(*r)
        console.print(table)
    host = host_sweep_table(s)
    if host:
        title, head, host_rows = host
        host_table = Table(title=title, title_justify="left")
        for h in head:
            host_table.add_column(h, justify="right")
        for row in host_rows:
            host_table.add_row(*row)
        console.print(host_table)
    clock = clock_line(s)
    if clock:
        console.print(clock, highlight=False)
    verdict = verdict_line(s)
    if verdict:
        console.print(verdict, highlight=False)


