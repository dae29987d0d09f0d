"""vLLM 0.33.0's recorded transcripts replayed against pagedkv, without vLLM.

``tests/conformance/transcripts/`` holds, for each of the suite's layouts, every answer
vLLM's own ``KVCacheManager`` gave over 10 seeds x 300 operations and its state after each
operation (recorded with ``python -m conformance --vllm-python VLLM_PY --record
tests/conformance/transcripts --seeds 10 --ops 300``). Replaying drives pagedkv through the
same operations and compares every recorded field, as the live differential run does.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from conformance.codec import VOID_METHODS
from conformance.layouts import LAYOUTS, Layout, layout_by_name
from conformance.pagedkv_side import PagedSide
from conformance.transcript import (
    Recorder,
    Transcript,
    layout_header,
    read_transcript,
    replay_seed,
    transcript_path,
    write_transcript,
)
from conformance.workload import run_seed

from conformance import __main__ as cli
from pagedkv.core import native

DIR = str(Path(__file__).parent / "transcripts")
SEEDS, OPS = 10, 300


def _load(layout: Layout) -> Transcript:
    return read_transcript(transcript_path(DIR, layout))


@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.name for x in LAYOUTS])
def test_pagedkv_replays_vllm_transcript(layout: Layout) -> None:
    transcript = _load(layout)
    assert transcript.header["recorded_with"] == "vLLM 0.33.0"
    assert transcript.header["layout"] == layout_header(layout)
    assert [s["seed"] for s in transcript.seeds] == list(range(SEEDS))
    assert transcript.num_ops == SEEDS * OPS
    for record in transcript.seeds:
        res = replay_seed(layout, transcript, record, PagedSide(layout))
        assert res.divergence is None, res.divergence
        assert res.num_ops == OPS


def _first_op_with(record: dict[str, Any], key: str, start: int) -> int:
    return next(i for i, op in enumerate(record["ops"]) if i >= start and key in op["s"])


def test_replay_reports_a_corrupted_value_at_its_operation() -> None:
    layout = layout_by_name("full+swa")
    transcript = _load(layout)
    record = copy.deepcopy(transcript.seeds[3])
    k = _first_op_with(record, "f", 150)
    record["ops"][k]["s"]["f"] += 1
    res = replay_seed(layout, transcript, record, PagedSide(layout))
    assert res.divergence is not None
    assert res.divergence.op_index == k
    assert res.divergence.detail.startswith("state after op: num_free: vllm=")


def _allocations(record: dict[str, Any]) -> list[tuple[int, int]]:
    """(operation, result index) of every granted allocation in a seed's record."""
    out = []
    for i, op in enumerate(record["ops"]):
        results = [c for c in op["m"] if c not in VOID_METHODS]
        out += [(i, j) for j, c in enumerate(results) if c == "C" and op["r"][j]]
    return out


def test_replay_reports_a_corrupted_allocation() -> None:
    layout = layout_by_name("full-16")
    transcript = _load(layout)
    record = copy.deepcopy(transcript.seeds[0])
    k, j = _allocations(record)[20]
    record["ops"][k]["r"][j][0].append(999)  # a block vLLM never handed out
    res = replay_seed(layout, transcript, record, PagedSide(layout))
    assert res.divergence is not None
    assert res.divergence.op_index == k
    assert res.divergence.detail.startswith("allocate ")
    assert "999]" in res.divergence.detail and "pagedkv=" in res.divergence.detail


def test_replay_catches_a_planted_free_queue_order_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """Freed cached blocks appended to the free queue in reverse order: the replay stops
    at the first operation whose free-queue order differs from vLLM's. (On the pure core:
    the compiled core's queue is a C type, which cannot be patched.)"""
    with native.forced_pure():
        _planted_free_queue_order_bug(monkeypatch)


def _planted_free_queue_order_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = layout_by_name("full-16")
    transcript = _load(layout)
    queue_cls = type(PagedSide(layout).mgr.pool.free_queue)  # wherever the engine keeps it
    original = queue_cls.append_n

    def reversed_append(self: Any, ids: list[int]) -> None:
        original(self, ids[::-1])

    monkeypatch.setattr(queue_cls, "append_n", reversed_append)
    res = replay_seed(layout, transcript, transcript.seeds[0], PagedSide(layout))
    assert res.divergence is not None
    assert "free_order" in res.divergence.detail
    monkeypatch.undo()
    assert replay_seed(layout, transcript, transcript.seeds[0], PagedSide(layout)).divergence \
        is None


def test_replay_says_when_the_workload_changed() -> None:
    layout = layout_by_name("swa")
    transcript = _load(layout)
    record = copy.deepcopy(transcript.seeds[1])
    record["ops"][40]["m"] = "S" + record["ops"][40]["m"]  # a call the workload never makes
    res = replay_seed(layout, transcript, record, PagedSide(layout))
    assert res.divergence is not None
    assert res.divergence.op_index == 40
    assert "the workload differs from the recorded one at operation 40" in res.divergence.detail


def test_record_write_read_replay_round_trip(tmp_path: Path) -> None:
    layout = layout_by_name("full+mamba/unit4")
    records = []
    for seed in (5, 6):
        rec = Recorder(PagedSide(layout))
        run_seed(layout, seed, 120, rec, None)
        records.append(rec.seed_record(seed, 120))
    header = {"format": 1, "recorded_with": "pagedkv", "layout": layout_header(layout),
              "extras": ["lora", "mm", "salt"], "bursts": False}
    path = str(tmp_path / "t.jsonl.gz")
    size = write_transcript(path, header, records)
    assert size == write_transcript(str(tmp_path / "u.jsonl.gz"), header, records)
    assert (tmp_path / "t.jsonl.gz").read_bytes() == (tmp_path / "u.jsonl.gz").read_bytes()
    transcript = read_transcript(path)
    assert transcript.num_ops == 240
    for record in transcript.seeds:
        assert replay_seed(layout, transcript, record, PagedSide(layout)).divergence is None


def test_bad_transcript_files_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"bad\.jsonl\.gz: not a gzip.d transcript"):
        read_transcript(str(bad))
    with pytest.raises(ValueError, match=r"no transcript .*missing\.jsonl\.gz"):
        read_transcript(str(tmp_path / "missing.jsonl.gz"))
    import gzip

    bad.write_bytes(gzip.compress(b'{"format": 1}\n{"seed": 0, "ops": [], "blob": 99}\n'))
    with pytest.raises(ValueError, match=r"line 2: .blob. is not the blob.s length"):
        read_transcript(str(bad))


def test_cli_replays_and_fails_without_vllm_or_transcripts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--replay", DIR, "--layouts", "full-16,swa"]) == 0
    out = capsys.readouterr().out
    assert "verdict: PASS" in out and "against=vLLM 0.33.0 transcript" in out
    # No vLLM and no transcripts: one line on stderr, non-zero exit.
    import conformance.vllm_side as vllm_side

    monkeypatch.setattr(vllm_side, "vllm_available", lambda: "ModuleNotFoundError: vllm")
    assert cli.main(["--seeds", "1"]) == 1
    err = capsys.readouterr()
    assert err.out == ""
    assert err.err.count("\n") == 1 and "vLLM is not importable here" in err.err
    assert cli.main(["--replay", str(tmp_path / "nowhere")]) == 1
    assert "no transcript directory" in capsys.readouterr().err
    assert cli.main(["--replay", str(tmp_path), "--layouts", "swa"]) == 1
    assert "no transcript" in capsys.readouterr().err
