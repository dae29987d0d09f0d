"""Miss tables and the stacked bar plot from a small replay."""

from __future__ import annotations

from pathlib import Path

import pytest
from observe_support import Clock, compute, full, observed

from pagedkv import InvalidArgumentError
from pagedkv.observe import LookupExplanation, ObserveConfig
from pagedkv.sim.observe_support import (
    intervals_from_explanations,
    merge_miss_stats,
    miss_table,
    plot_missed_tokens,
    render_miss_table,
)


def replay() -> list[tuple[float, LookupExplanation]]:
    clock = Clock()
    mgr = observed([full(16)], num_blocks=12, observe=ObserveConfig(clock=clock))
    timed = []
    for i in range(30):
        clock.now = float(i)
        prompt = list(range(64)) + list(range(1000 + 40 * i, 1040 + 40 * i))
        if i % 3 == 0:  # a document asked about twice, 6 requests apart
            d = i // 6
            prompt = list(range(5000 + d * 100, 5000 + d * 100 + 50))
        r = mgr.new_request(f"r{i}", prompt)
        timed.append((clock.now, mgr.observe.explain_lookup(r)))
        compute(mgr, r)
        mgr.free(r)
    return timed


def test_table_and_intervals_add_up(tmp_path: Path) -> None:
    series = intervals_from_explanations(replay(), 5.0)
    assert [t for t, _ in series] == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]
    total = merge_miss_stats(s for _, s in series)
    assert total.requests == 30
    assert total.queries == total.hits + sum(total.missed_tokens.values())
    assert {"evicted", "never_seen", "partial_block"} <= set(total.missed_tokens)
    rows = miss_table([total])
    assert rows[-2].label == "total missed" and rows[-1].label == "hit"
    assert sum(r.tokens for r in rows[:-2]) == rows[-2].tokens
    text = render_miss_table(rows)
    assert "evicted" in text and "% of queried" in text
    png = plot_missed_tokens(series, tmp_path / "misses.png", title="test")
    assert png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_empty_inputs_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="interval_s"):
        intervals_from_explanations([], 0)
    with pytest.raises(InvalidArgumentError, match="no intervals"):
        plot_missed_tokens([], "x.png")
