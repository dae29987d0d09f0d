"""Every bad ``pagedkv simulate`` invocation: exactly one line on stderr, exit 1 (the run
cannot be done: a bad file) or 2 (the caller's mistake: usage, a value out of range,
options that contradict), no traceback — run in a subprocess, as a user would."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

CASES: list[tuple[str, list[str], int, str]] = [
    # (name, argv after "simulate", exit code, text the line must contain)
    ("binary trace", ["--trace", "{binary}"], 1, "binary file"),
    ("fake gzip", ["--trace", "{fakegz}"], 1, "not gzip"),
    ("corrupt gzip", ["--trace", "{badgz}"], 1, "gzip"),
    ("json document, not lines", ["--trace", "{jsondoc}"], 1,
     "expected a kv-cache-tester session"),
    ("json array", ["--trace", "{jsonarray}"], 1, "JSON array; expected"),
    ("empty trace", ["--trace", "{empty}"], 1, "empty"),
    ("unknown content", ["--trace", "{text}"], 1, "cannot tell the trace format"),
    ("missing trace", ["--trace", "{tmp}/nope.jsonl"], 1, "cannot open"),
    ("glob without match", ["--trace", "{tmp}/*.nothing"], 1, "matches no file"),
    ("unwritable plot dir", ["--plot-dir", "{blocker}/sub", "--limit", "5"], 1,
     "plot directory not writable"),
    ("reference in engine mode", ["--semantics", "reference"], 2, "--mode pure-cache"),
    ("reference at a multiple", ["--semantics", "reference", "--mode", "pure-cache",
                                 "--block-size", "1024"], 2, "dividing 512"),
    ("bad ttft", ["--find-capacity", "--ttft-p99", "soon"], 2, "positive duration"),
    ("find capacity in pure cache", ["--find-capacity", "--mode", "pure-cache"], 2,
     "--mode engine"),
    ("zero jobs", ["--jobs", "0"], 2, "--jobs"),
    ("one block", ["--num-blocks", "1"], 2, ">= 2"),
    ("num blocks and model", ["--num-blocks", "9", "--model", "Llama-3.1-8B"], 2,
     "either --num-blocks"),
    ("unknown model", ["--model", "no-such-model"], 1, "no bundled config"),
    ("bad block size", ["--block-size", "48"], 2, "divisor of 512"),
    ("negative stagger", ["--trace", "{tmp}", "--session-stagger-s", "-1"], 2, "stagger"),
    ("pool too large", ["--trace", "{hugecsv}", "--num-blocks", str(10**12)], 2, "at most"),
    ("bad sweep", ["--capacity-sweep", "lots", "--mode", "pure-cache"], 2, "token count"),
    ("sweep below a block", ["--capacity-sweep", "3", "--mode", "pure-cache"], 2,
     "less than one block"),
    ("warm-up fraction", ["--warmup-fraction", "1.5"], 2, "[0, 1)"),
    ("unknown flag", ["--frobnicate"], 2, "unrecognized arguments"),
    ("bad mode", ["--mode", "fast"], 2, "invalid choice"),
    ("non-integer blocks", ["--num-blocks", "many"], 2, "must be a whole number"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    (tmp / "fake.jsonl.gz").write_text('{"timestamp": 0}\n')
    (tmp / "bad.jsonl.gz").write_bytes(gzip.compress(b'{"timestamp": 0}\n' * 100)[:40])
    (tmp / "doc.json").write_text(json.dumps({"timestamp": 0, "requests": 3}, indent=2))
    (tmp / "array.json").write_text(json.dumps([{"timestamp": 0}]))
    (tmp / "empty.jsonl").write_text("")
    (tmp / "notes.txt2").write_text("hello\n")
    (tmp / "blocker").write_text("a file where a directory should be")
    (tmp / "huge.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                  "2023-11-16 18:15:46.6805900,400000000,1\n")
    return {
        "binary": str(tmp / "binary.jsonl"), "fakegz": str(tmp / "fake.jsonl.gz"),
        "badgz": str(tmp / "bad.jsonl.gz"), "jsondoc": str(tmp / "doc.json"),
        "jsonarray": str(tmp / "array.json"), "empty": str(tmp / "empty.jsonl"),
        "text": str(tmp / "notes.txt2"), "tmp": str(tmp), "blocker": str(tmp / "blocker"),
        "hugecsv": str(tmp / "huge.csv"),
    }


@pytest.mark.parametrize(("name", "argv", "code", "text"), CASES, ids=[c[0] for c in CASES])
def test_bad_invocation(
    files: dict[str, str], name: str, argv: list[str], code: int, text: str
) -> None:
    args = [a.format(**files) for a in argv]
    proc = subprocess.run(
        [sys.executable, "-m", "pagedkv", "simulate", "--no-progress", *args],
        capture_output=True, text=True, timeout=120, cwd=Path(files["tmp"]),
    )
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == code, (name, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(err) == 1, err
    assert err[0].startswith("pagedkv") and "error:" in err[0] and text in err[0], err
