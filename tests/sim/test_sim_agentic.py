"""kv-cache-tester agentic sessions: one file, a directory and a glob replay; sub-agents are
placed at their start plus their relative times; a non-monotone ``t`` is sorted; ids are
local to a file; the infinite-cache hit rate equals the ideal computed from the file."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trace_data import read_text

from pagedkv import InputFileError
from pagedkv.sim import EngineSimulator, load_trace, run_pure_cache
from pagedkv.sim.bounds import access_sequence, infinite_cache_hits
from pagedkv.sim.pure_cache import unlimited_num_blocks

BS = 64


def _req(t: float, n: int, ids: list[int], out: int = 5) -> dict[str, Any]:
    return {"t": t, "type": "n", "in": n, "out": out, "hash_ids": ids}


def session(name: str) -> dict[str, Any]:
    """System prompt ids 1..3, a conversation growing by turns, one sub-agent at t=30 with
    its own requests at relative 0 and 4 (so 30 and 34), and a turn whose t (20) is
    earlier than the sub-agent's line before it."""
    return {
        "id": name, "block_size": BS, "hash_id_scope": "local",
        "requests": [
            _req(0.0, 3 * BS + 10, [1, 2, 3]),
            _req(10.0, 5 * BS, [1, 2, 3, 4, 5]),
            {"t": 30.0, "type": "subagent", "requests": [
                _req(0.0, 2 * BS + 1, [1, 2]),
                _req(4.0, 4 * BS + 63, [1, 2, 7, 8]),
            ]},
            _req(20.0, 7 * BS + 5, [1, 2, 3, 4, 5, 6, 9]),
            {"t": 40.0, "type": "s", "in": 7 * BS + 5, "out": 3,
             "hash_ids": [1, 2, 3, 4, 5, 6, 9], "model": "m", "stop": "end_turn"},
        ],
    }


def ideal_from_file(paths: list[Path], stagger_s: float = 0.0) -> float:
    """The infinite-cache hit rate straight from the JSON: requests by absolute time,
    ids named apart per file, each hits the longest prefix of its ids some earlier
    request stored, at most floor((in-1)/64) blocks (the last token is recomputed)."""
    flat: list[tuple[float, int, list[tuple[int, int]]]] = []

    def walk(items: list[dict[str, Any]], base: float, f: int) -> None:
        for it in items:
            if it["type"] == "subagent":
                walk(it["requests"], base + it["t"], f)
            else:
                flat.append((base + it["t"], it["in"], [(f, h) for h in it["hash_ids"]]))

    for f, p in enumerate(paths):
        walk(json.loads(read_text(p))["requests"], f * stagger_s, f)
    flat.sort(key=lambda x: x[0])
    # every stored prefix is numbered: (number of the prefix before it, last id) -> number
    # (0 is the empty prefix), so a prefix is looked up and stored in one step per id
    seen: dict[tuple[int, tuple[int, int]], int] = {}
    hit = total = 0
    for _, n, ids in flat:
        m, prefix = 0, 0
        while m < min(len(ids), (n - 1) // BS) and (prefix, ids[m]) in seen:
            prefix = seen[(prefix, ids[m])]
            m += 1
        hit += m * BS
        total += n
        prefix = 0
        for h in ids:
            prefix = seen.setdefault((prefix, h), len(seen) + 1)
    return hit / total


@pytest.fixture
def sessions(tmp_path: Path) -> list[Path]:
    paths = []
    for name in ("a", "b"):
        p = tmp_path / "sessions" / f"{name}.json"
        p.parent.mkdir(exist_ok=True)
        p.write_text(json.dumps(session(name)))
        paths.append(p)
    (tmp_path / "sessions" / "LICENSE").write_text("not a trace")
    return paths


def _infinite(wl: Any, bs: int = BS) -> float:
    return infinite_cache_hits(access_sequence(wl, bs)).hit_rate()


def test_one_session(sessions: list[Path]) -> None:
    wl = load_trace(sessions[0])
    assert wl.source_block_size == BS and len(wl.requests) == 6
    assert [r.arrival_s for r in wl.requests] == [0, 10, 20, 30, 34, 40]
    assert "(2 in sub-agents)" in wl.description
    ideal = ideal_from_file(sessions[:1])
    assert ideal > 0.3
    assert _infinite(wl) == pytest.approx(ideal)
    seq = access_sequence(wl, BS)
    lru = run_pure_cache(wl, block_size=BS, num_blocks=unlimited_num_blocks(seq),
                         check_invariants=True)
    assert lru.hit_rate() == pytest.approx(ideal)
    for bs in (16, 32):  # divisors of the session's block size replay it too
        assert _infinite(wl, bs) >= ideal


def test_directory_and_glob_are_concurrent_sessions_with_local_ids(
    sessions: list[Path],
) -> None:
    directory = sessions[0].parent
    wl = load_trace(directory, session_stagger_s=5.0)
    assert len(wl.requests) == 12
    assert sorted(r.arrival_s for r in wl.requests)[:4] == [0, 5, 10, 15]
    ideal = ideal_from_file(sessions, stagger_s=5.0)
    # ids are local: the second session shares nothing with the first, so the rate is
    # exactly the one-session rate
    assert _infinite(wl) == pytest.approx(ideal) == pytest.approx(ideal_from_file(sessions[:1]))
    assert _infinite(load_trace(str(directory / "*.json"))) == pytest.approx(ideal)
    res = EngineSimulator(wl, block_size=16, num_blocks=400).run()
    assert res.num_finished == 12 and res.hit_rate() > 0


def test_real_sessions_replay(data: Callable[[str], Path]) -> None:
    one = data("traces/kv-cache-tester/trace_0003.json.gz")
    wl = load_trace(one)
    assert len(wl.requests) == 409 and "(14 in sub-agents)" in wl.description
    ideal = ideal_from_file([one])
    assert _infinite(wl) == pytest.approx(ideal) and ideal > 0.9
    both = load_trace(one.parent)
    assert len(both.requests) == 409 + 41


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x01\x02binary", "binary file"),
        (b'{"requests": [{"t": 0, "in": 100, "out": 1}]}', "key 'requests[0].hash_ids': missing"),
        (b'{"requests": [{"t": -1, "in": 100, "out": 1, "hash_ids": [1]}]}', ">= 0"),
        (b'{"requests": [{"t": 0, "in": 100, "out": 1, "hash_ids": [1, 2, 3]}]}',
         "full 64-token blocks"),
        (b'{"requests": [{"t": 0, "type": "subagent", "requests": [{"t": 1, "in": 64, '
         b'"out": 1, "hash_ids": "x"}]}]}', "requests[0].requests[0].hash_ids"),
        (b'{"sessions": []}', "expected a kv-cache-tester session"),
        (b'[{"timestamp": 0}]', "expected a kv-cache-tester session"),
        (b"", "empty"),
    ],
)
def test_bad_session_files(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "s.json"
    p.write_bytes(content)
    with pytest.raises(InputFileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_trace(p)


def test_gzip_and_format_detection(tmp_path: Path, sessions: list[Path]) -> None:
    gz = tmp_path / "s.json.gz"
    gz.write_bytes(gzip.compress(sessions[0].read_bytes()))
    assert len(load_trace(gz).requests) == 6
    fake = tmp_path / "t.jsonl.gz"
    fake.write_text('{"timestamp": 0}\n')
    with pytest.raises(InputFileError, match="not gzip"):
        load_trace(fake)
    odd = tmp_path / "trace.dat"
    odd.write_text("hello world\n")
    with pytest.raises(InputFileError, match=r"expected one of .*kv-cache-tester"):
        load_trace(odd)
    # content wins over the name: a session saved as .jsonl is still a session
    renamed = tmp_path / "s.jsonl"
    renamed.write_bytes(sessions[0].read_bytes())
    assert len(load_trace(renamed).requests) == 6
