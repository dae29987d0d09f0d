"""The cache key: stable across runs and spellings, different when any input changes;
entries written whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pagedkv.sweep.cache import ResultCache, point_key, workload_digest


def test_key_is_stable_and_canonical() -> None:
    a = point_key("d" * 64, {"gpu": "H100-SXM", "tp": 2, "host_memory": (1, 2)},
                  version="1.0")
    b = point_key("d" * 64, {"host_memory": [1, 2], "tp": 2, "gpu": "H100-SXM"},
                  version="1.0")
    assert a == b
    # A fixed value, so a change in how keys are made shows up (an old cache goes stale).
    assert a == "0672328c7c95a50893094cdad1af6ab760e81c03d5757dd9c64ccbc273f133ea"


def test_key_changes_with_every_input() -> None:
    base = point_key("d" * 64, {"tp": 2}, version="1.0")
    assert point_key("e" * 64, {"tp": 2}, version="1.0") != base
    assert point_key("d" * 64, {"tp": 4}, version="1.0") != base
    assert point_key("d" * 64, {"tp": 2, "gpu": "H200"}, version="1.0") != base
    assert point_key("d" * 64, {"tp": 2}, version="1.1") != base
    # the trace's path is not an input: its bytes are (the digest)
    assert point_key("d" * 64, {"tp": 2, "trace": "/a/t.jsonl"}, version="1.0") == base


def test_workload_digest_is_the_bytes(tmp_path: Path) -> None:
    t = tmp_path / "t.jsonl"
    t.write_bytes(b'{"timestamp": 0, "input_length": 10, "output_length": 2, '
                  b'"hash_ids": [1]}\n')
    d1 = workload_digest({"trace": str(t)})
    moved = tmp_path / "sub"
    moved.mkdir()
    (moved / "t.jsonl").write_bytes(t.read_bytes())
    assert workload_digest({"trace": str(moved / "t.jsonl")}) == d1
    t.write_bytes(t.read_bytes().replace(b"10", b"11"))
    assert workload_digest({"trace": str(t)}) != d1
    assert workload_digest({}) == workload_digest({})  # the bundled trace
    assert workload_digest({"generator": "agent"}) != workload_digest({"generator": "x"})


def test_entries_are_whole_or_absent(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path / "c")
    key = "ab" + "0" * 62
    assert cache.get(key) is None and cache.count() == 0
    cache.put(key, {"metrics": {"hit_rate": 0.5}})
    assert cache.get(key) == {"key": key, "metrics": {"hit_rate": 0.5}}
    assert cache.count() == 1
    assert not [p for p in cache.path(key).parent.iterdir() if p.name.endswith(".tmp")]
    cache.path(key).write_text('{"key": "ab00", "metr')  # a torn file is never trusted
    assert cache.get(key) is None
    cache.path(key).write_text(json.dumps({"key": "other", "metrics": {}}))
    assert cache.get(key) is None


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ResultCache(tmp_path / "c")
    key = "cd" + "1" * 62

    def boom(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        cache.put(key, {"metrics": {}})
    assert cache.get(key) is None
    assert list(cache.path(key).parent.iterdir()) == []
