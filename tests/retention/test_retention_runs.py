"""``RequestRetention.block_runs`` (what ``free`` applies, run by run) equals the per-block
rule ``block_retention`` for every block, on random ranges and lengths."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.retention import RequestRetention, TokenRangeRetention

PRIORITIES = st.sampled_from([0, 10, 35, 80, 100])
DURATIONS = st.sampled_from([None, 1.0, 5.0])


@st.composite
def token_ranges(draw: st.DrawFn) -> TokenRangeRetention:
    start = draw(st.integers(0, 60))
    end = draw(st.one_of(st.none(), st.integers(start + 1, start + 40)))
    return TokenRangeRetention(token_start=start, token_end=end, priority=draw(PRIORITIES),
                               duration_s=draw(DURATIONS))


@settings(max_examples=300, deadline=None)
@given(
    ranges=st.lists(token_ranges(), max_size=4),
    decode_priority=PRIORITIES,
    decode_duration_s=st.sampled_from([None, 2.0]),
    default_priority=st.sampled_from([20, 35]),
    block_size=st.sampled_from([1, 4, 16]),
    num_blocks=st.integers(0, 20),
    num_prompt_tokens=st.integers(0, 80),
)
def test_block_runs_match_per_block_rule(
    ranges: list[TokenRangeRetention], decode_priority: int, decode_duration_s: float | None,
    default_priority: int, block_size: int, num_blocks: int, num_prompt_tokens: int,
) -> None:
    r = RequestRetention(ranges=tuple(ranges), decode_priority=decode_priority,
                         decode_duration_s=decode_duration_s,
                         default_priority=default_priority)
    want = [r.block_retention(i, block_size, num_prompt_tokens=num_prompt_tokens)
            for i in range(num_blocks)]
    runs = r.block_runs(num_blocks, block_size, num_prompt_tokens=num_prompt_tokens)
    got = [(p, d) for first, stop, p, d in runs for _ in range(first, stop)]
    assert got == want
    assert [i for first, stop, _, _ in runs for i in range(first, stop)] == list(range(num_blocks))
    ps, ds = r.blocks_retention(num_blocks, block_size, num_prompt_tokens=num_prompt_tokens)
    assert list(zip(ps, ds, strict=True)) == want
