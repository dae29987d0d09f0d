"""The suite's three runs, one line per layout and a verdict: live (vLLM and pagedkv in one
process), record (vLLM alone, to transcripts) and replay (pagedkv against transcripts)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from conformance.layouts import LAYOUTS, Layout, layouts_for, release_of
from conformance.pagedkv_side import PagedSide
from conformance.transcript import (
    FORMAT,
    Recorder,
    layout_header,
    read_transcript,
    replay_seed,
    transcript_path,
    write_transcript,
)
from conformance.workload import Divergence, run_seed

__all__ = ["RunOptions", "live_layouts", "record_layouts", "replay_layouts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """What a live run or a recording drives (a replay takes them from the transcript)."""

    seeds: range
    num_ops: int
    extras: frozenset[str]
    ignore: frozenset[str] = frozenset()
    bursts: bool = False
    keep_going: bool = False


def _report(name: str, bad: list[int], first: Divergence | None, line: str) -> None:
    status = "OK" if not bad else "DIVERGED"
    print(f"{name:20} {status:8} {line}", flush=True)
    if len(bad) > 1:
        shown = ",".join(map(str, bad[:40])) + (",..." if len(bad) > 40 else "")
        print(f"  divergent seeds: {shown}", flush=True)
    if first is not None:
        print(
            f"  first divergence: seed={first.seed} op_index={first.op_index} op={first.op}\n"
            f"  {first.detail[:2000]}",
            flush=True,
        )


def _verdict(failed: int, total: int) -> int:
    verdict = "PASS" if not failed else f"FAIL ({failed} of {total} layouts diverged)"
    print(f"verdict: {verdict}")
    return 1 if failed else 0


def live_layouts(layouts: tuple[Layout, ...], opts: RunOptions) -> int:
    """vLLM's manager and pagedkv's side by side; 1 when a layout diverged."""
    import vllm

    from conformance.vllm_side import VllmSide

    release = release_of(vllm.__version__)
    # Warm both sides up (imports, first-call caches) so the speed column is steady state.
    run_seed(layouts[0], 10**6, 50, VllmSide(layouts[0]), PagedSide(layouts[0], release))
    failed = 0
    for lay in layouts:
        t0 = time.perf_counter()
        bad: list[int] = []
        first = None
        secs = {"vllm": 0.0, "pagedkv": 0.0}
        ops = 0
        for seed in opts.seeds:
            res = run_seed(
                lay, seed, opts.num_ops, VllmSide(lay), PagedSide(lay, release),
                extras=opts.extras, ignore=opts.ignore, bursts=opts.bursts,
            )
            ops += res.num_ops
            for k, v in res.seconds.items():
                secs[k] += v
            if res.divergence is not None:
                bad.append(seed)
                first = first or res.divergence
                if not opts.keep_going:
                    break
        ratio = secs["vllm"] / secs["pagedkv"] if secs["pagedkv"] else 0.0
        num_run = len(opts.seeds) if opts.keep_going or not bad else bad[0] - opts.seeds[0] + 1
        more = "" if opts.keep_going or not bad else "+"
        _report(
            lay.name, bad, first,
            f"seeds={num_run} ops={ops} divergent_seeds={len(bad)}{more}"
            f" speed_vs_vllm={ratio:.2f}x wall={time.perf_counter() - t0:.1f}s",
        )
        failed += first is not None
    return _verdict(failed, len(layouts))


def _coverage_line(num_layouts: int, counts: dict[str, int]) -> str:
    """What the replay compared, e.g. ``compared 54000 operations on 18 layouts: ...``."""
    shown = (
        ("lookup", "lookups"),
        ("truncate", "truncated hits"),
        ("allocate", "allocations"),
        ("allocate-refused", "of them refused"),
        ("pop_for_free", "deferred frees"),
        ("take_copies", "copy lists"),
        ("take_zeroing", "zeroing lists"),
        ("estimate", "estimates"),
        ("block_hashes", "block-hash lists"),
        ("reset", "resets"),
        ("events", "event batches"),
    )
    parts = ", ".join(f"{counts.get(key, 0)} {label}" for key, label in shown)
    # A KV connector's calls, named only where a layout makes them.
    connector = (
        ("lookup_groups", "per-group lookups"),
        ("evict", "evictions"),
        ("take_offloads", "offload lists"),
        ("finalize_tails", "tail finalizations"),
    )
    parts += "".join(f", {counts[key]} {label}" for key, label in connector
                     if counts.get(key))
    return (
        f"compared {counts['operations']} operations on {num_layouts} layouts (state after "
        f"each): {parts}"
    )


def record_layouts(directory: str, layouts: tuple[Layout, ...], opts: RunOptions) -> int:
    """Drive vLLM's manager alone and write one transcript per layout under ``directory``."""
    import vllm

    from conformance.vllm_side import VllmSide

    total_ops = total_bytes = 0
    for lay in layouts:
        t0 = time.perf_counter()
        records: list[dict[str, Any]] = []
        for seed in opts.seeds:
            rec = Recorder(VllmSide(lay))
            run_seed(lay, seed, opts.num_ops, rec, None, extras=opts.extras, bursts=opts.bursts)
            records.append(rec.seed_record(seed, opts.num_ops))
        header = {
            "format": FORMAT,
            "recorded_with": f"vLLM {vllm.__version__}",
            "layout": layout_header(lay),
            "extras": sorted(opts.extras),
            "bursts": opts.bursts,
        }
        path = transcript_path(directory, lay)
        size = write_transcript(path, header, records)
        ops = len(records) * opts.num_ops
        total_ops += ops
        total_bytes += size
        print(
            f"{lay.name:20} recorded seeds={len(records)} ops={ops} bytes={size} "
            f"wall={time.perf_counter() - t0:.1f}s -> {path}",
            flush=True,
        )
    print(f"recorded {len(layouts)} layouts, {total_ops} operations, {total_bytes} bytes")
    return 0


def replay_layouts(directory: str, layouts: tuple[Layout, ...] | None,
                   ignore: frozenset[str]) -> int:
    """Compare pagedkv with the transcripts under ``directory`` (``layouts`` None: every
    layout the release they were recorded with runs); 1 when a layout diverged or its
    transcript is missing, stale or unreadable (one line on stderr). pagedkv runs with the
    profile of the release each transcript names (``CacheConfig.vllm_release``)."""
    if not os.path.isdir(directory):
        print(f"conformance: no transcript directory {directory!r}", file=sys.stderr)
        return 1
    if layouts is None:
        layouts = layouts_for(directory_release(directory))
    failed = 0
    counts: dict[str, int] = {"operations": 0}
    for lay in layouts:
        t0 = time.perf_counter()
        path = transcript_path(directory, lay)
        try:
            transcript = read_transcript(path)
        except ValueError as exc:
            print(f"conformance: {lay.name}: {exc}", file=sys.stderr)
            return 1
        if transcript.header.get("layout") != layout_header(lay):
            print(
                f"conformance: {path}: recorded for another definition of layout {lay.name} "
                "(conformance/layouts.py changed); record it again with --record",
                file=sys.stderr,
            )
            return 1
        counts["operations"] += transcript.num_ops
        for name, n in transcript.call_counts().items():
            counts[name] = counts.get(name, 0) + n
        bad: list[int] = []
        first = None
        for record in transcript.seeds:
            side = PagedSide(lay, release_of(transcript.header.get("recorded_with", "0.33")))
            res = replay_seed(lay, transcript, record, side, ignore)
            if res.divergence is not None:
                bad.append(record["seed"])
                first = first or res.divergence
        _report(
            lay.name, bad, first,
            f"seeds={len(transcript.seeds)} ops={transcript.num_ops} divergent_seeds={len(bad)}"
            f" against={transcript.header.get('recorded_with', '?')} transcript"
            f" wall={time.perf_counter() - t0:.1f}s",
        )
        failed += first is not None
    print(_coverage_line(len(layouts), counts))
    return _verdict(failed, len(layouts))


def directory_release(directory: str) -> str:
    """The vLLM series the transcripts under ``directory`` were recorded with (read from
    the first one found; "0.33" when none is readable: the replay then names the file)."""
    for lay in LAYOUTS:
        path = transcript_path(directory, lay)
        if os.path.exists(path):
            try:
                return release_of(str(read_transcript(path).header.get("recorded_with", "")))
            except ValueError:
                break
    return "0.33"
