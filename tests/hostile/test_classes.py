"""One test per class of hostile input that once got through (docs/reliability.md lists
them): unbounded and special files, nesting and digits, duplicate keys, work sized by
input, endpoints, surrogates, bytes where text belongs, the vLLM adapter's client fields,
tokens behind the facade. Each runs on both cores (CI runs the suite twice)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pagedkv import FullAttentionSpec, HashExtras, KVCacheManager, Request
from pagedkv.errors import ConfigError, InputFileError, InvalidArgumentError, PagedKVError
from pagedkv.input_files import load_document
from pagedkv.planner.bundled import bundled_model_names, load_config

HERE = Path(__file__).resolve().parent
CONSTRUCTED = HERE.parent / "planner" / "constructed_configs"


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pagedkv", *argv], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


# ------------------------------------------------------------------- real configs load

CORPUS = [*bundled_model_names(), *sorted(str(p) for p in CONSTRUCTED.glob("*.json")),
          str(HERE / "configs" / "Nemotron-H-8B-infinity.json")]


@pytest.mark.parametrize("model", CORPUS, ids=lambda m: Path(m).stem)
def test_real_configs_load_and_plan(model: str) -> None:
    """Every family the planner reads, quirks included (Infinity in Nemotron-H)."""
    from pagedkv.cli import main

    config, _, _ = load_config(model)
    assert isinstance(config, dict)
    code, err = _run_main(main, ["plan", model, "--kv-cache-memory", "80GiB",
                                 "--max-model-len", "4096"])
    assert code == 0, err


def test_infinity_is_read_not_refused() -> None:
    config, _, _ = load_config(str(HERE / "configs" / "Nemotron-H-8B-infinity.json"))
    assert config["time_step_limit"] == [0.0, float("inf")]


# ---------------------------------------------------------- special files, every reader

FILE_OPTIONS = [
    ("sweep", "", "grid.json"), ("simulate", "--gpu", "gpu.json"),
    ("simulate", "--calibration", "cal.json"), ("simulate", "--calibrate", "bench.json"),
    ("sweep", "--prices", "prices.json"), ("plan", "", "config.json"),
    ("simulate", "--trace", "trace.jsonl"),
]
HOSTILE_FILES = {
    "dev-zero": None, "fifo": None, "directory": None,
    "deep": "[" * 100_000, "digits": '{"a": ' + "9" * 5000 + "}",
    "duplicate": '{"a": 1, "a": 2}', "latin1": b'{"a": "\xe9"}',
}


def _make(tmp_path: Path, kind: str, name: str) -> Path:
    p = tmp_path / name
    content = HOSTILE_FILES[kind]
    if kind == "dev-zero":
        p.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    elif isinstance(content, bytes):
        p.write_bytes(content)
    else:
        assert content is not None
        p.write_text(content)
    return p


@pytest.mark.parametrize("kind", sorted(HOSTILE_FILES))
@pytest.mark.parametrize(("command", "flag", "name"), FILE_OPTIONS,
                         ids=[f"{c} {f or 'FILE'}" for c, f, _ in FILE_OPTIONS])
def test_file_options_refuse_hostile_files(tmp_path: Path, command: str, flag: str,
                                           name: str, kind: str) -> None:
    """One line, exit 1 or 2, no traceback, bounded time (a FIFO never blocks)."""
    from pagedkv.cli import main

    path = _make(tmp_path, kind, name)
    argv = [command, *([flag] if flag else []), str(path)]
    if command == "plan":
        argv += ["--kv-cache-memory", "10GiB"]
    if command == "simulate":
        argv += ["--limit", "2"]
    if flag == "--prices":
        argv += ["--axis", "tp=1,2", "--set", "limit=2"]
    os.chdir(tmp_path)
    code = _run_main(main, argv)
    assert code[0] in (1, 2), code
    assert code[1].count("\n") == 1 and "Traceback" not in code[1], code[1]
    assert str(path.name) in code[1] or kind == "directory", code[1]


def _run_main(main: Any, argv: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


@pytest.mark.parametrize(("suffix", "text", "words"), [
    (".json", '{"tp": [1], "tp": [2]}', "key 'tp' written twice"),
    (".yaml", "tp: [1]\ntp: [2]\n", "key 'tp' written twice"),
    (".toml", "tp = [1]\ntp = [2]\n", "not valid TOML"),
    (".yaml", "a: &x [1]\nb: *x\n", "anchors"),
])
def test_a_grid_with_an_axis_twice_is_refused(tmp_path: Path, suffix: str, text: str,
                                              words: str) -> None:
    from pagedkv.sweep.grid import load_grid_file

    p = tmp_path / f"grid{suffix}"
    p.write_text(text)
    with pytest.raises(InputFileError, match=words) as info:
        load_grid_file(p)
    assert str(p) in str(info.value)


def test_errors_name_file_line_and_key(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text('{\n "x": 1,\n "y": {"z": 1,\n  "z": 2}}')
    with pytest.raises(InputFileError, match=r"c\.json:4: key 'z' written twice"):
        load_document(p)
    p.write_bytes(b'{\n "x": "\xff"}')
    with pytest.raises(InputFileError, match=r"c\.json:2: not UTF-8 text \(byte 9"):
        load_document(p)


# ------------------------------------------------------------- work sized by the input

def test_a_calibration_of_a_billion_requests_is_refused_in_bounded_memory(
        tmp_path: Path) -> None:
    """``completed: 1e9`` once built 10**9 request copies (21 GiB); now refused with the
    limit named. The child's peak RSS is printed (docs/reliability.md quotes it)."""
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"completed": 1e9, "total_input_tokens": 1e11,
                                 "total_output_tokens": 1e11, "mean_ttft_ms": 50,
                                 "mean_tpot_ms": 10}))
    # This child's own peak (os.wait4), not RUSAGE_CHILDREN's maximum over every child the
    # test process ever waited for.
    with subprocess.Popen([sys.executable, "-m", "pagedkv", "simulate", "--calibrate",
                           str(bench), "--limit", "2"], cwd=tmp_path, text=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as child:
        assert child.stderr is not None
        stderr = child.stderr.read()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    peak_mib = usage.ru_maxrss / 1024
    print(f"completed: 1e9 -> exit {child.returncode}, child peak RSS {peak_mib:.0f} MiB")
    assert child.returncode == 1, stderr
    assert "more than the limit of 100,000" in stderr
    assert stderr.count("\n") == 1
    assert peak_mib < 1024


# -------------------------------------------------------------------------- the API

def test_sweep_cache_entry_with_bad_metrics_is_recomputed(tmp_path: Path) -> None:
    from pagedkv.sweep.cache import ResultCache

    cache = ResultCache(tmp_path)
    for entry in ({"key": "ab12", "metrics": "oops"}, {"key": "ab12"},
                  {"key": "ab12", "metrics": {}, "wall_s": "x"}):
        cache.put("ab12", entry)
        assert cache.get("ab12") is None
    cache.put("ab12", {"key": "ab12", "metrics": {"a": 1}, "wall_s": 0.5})
    assert cache.get("ab12") is not None


def test_lone_surrogates_are_refused() -> None:
    with pytest.raises(PagedKVError, match="surrogate"):
        HashExtras(cache_salt="\ud800")
    from pagedkv.events.config import KVEventsConfig

    with pytest.raises(ConfigError, match="surrogate"):
        KVEventsConfig(topic="kv\udcff")


@pytest.mark.parametrize("flag", ["--model", "--kv-events-topic"])
def test_non_utf8_argv_bytes_are_named(tmp_path: Path, flag: str) -> None:
    proc = subprocess.run([sys.executable.encode(), b"-m", b"pagedkv", b"simulate",
                           flag.encode(), b"ab\xff"], capture_output=True, timeout=120,
                          cwd=tmp_path)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and err.count("\n") == 1, err
    assert "0xff, not UTF-8" in err


def test_non_utf8_subscribe_is_named(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable.encode(), b"-m", b"pagedkv", b"index", b"serve",
                           b"--subscribe", b"tcp://127.0.0.1:1\xff"], capture_output=True,
                          timeout=120, cwd=tmp_path)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and "0xff, not UTF-8" in err, err


def test_a_bytearray_prompt_is_a_documented_error() -> None:
    with pytest.raises(InvalidArgumentError):
        Request("r", bytearray(b"\x01\x02"))  # type: ignore[arg-type]


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:99999", "tcp://127.0.0.1:0",
                                      "tcp://127.0.0.1:-5", "tcp://127.0.0.1", "5557"])
def test_endpoints_are_parsed(endpoint: str) -> None:
    from pagedkv.events.config import KVEventsConfig

    with pytest.raises(ConfigError, match=r"KVEventsConfig\.endpoint"):
        KVEventsConfig(endpoint=endpoint)


def test_simulate_refuses_a_wrapped_port(tmp_path: Path) -> None:
    proc = _cli("simulate", "--limit", "2", "--kv-events-endpoint",
                "tcp://127.0.0.1:99999", cwd=tmp_path)
    assert proc.returncode == 1 and "the port must be 1 to 65535" in proc.stderr


@pytest.mark.parametrize("port", [-1, 70000, "x", 1.5, None, True])
def test_metrics_serve_port_is_checked(port: Any) -> None:
    prom = pytest.importorskip("prometheus_client")
    assert prom
    from pagedkv.observe.prometheus import PrometheusExporter

    exporter = PrometheusExporter()
    with pytest.raises(InvalidArgumentError, match="serve\\(port\\)"):
        exporter.serve(port)
    with pytest.raises(InvalidArgumentError, match="KVCacheManager"):
        exporter.record(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"token_start": True}, {"token_end": True},
                                    {"duration_s": 1e300}, {"priority": True}])
def test_token_range_retention_refuses_bools_and_huge_durations(
        kwargs: dict[str, Any]) -> None:
    from pagedkv.retention.policy import TokenRangeRetention

    with pytest.raises(InvalidArgumentError):
        TokenRangeRetention(**kwargs)


@pytest.mark.parametrize("retention", [{"ranges": 5}, {"ranges": None}, None, 5,
                                       {"ranges": [{"start": 0, "duration_s": 1e300}]}])
def test_adapter_retention_fields_are_logged_and_ignored(
        retention: Any, caplog: pytest.LogCaptureFixture) -> None:
    from pagedkv.vllm.extras import parse_retention, retention_of

    with pytest.raises(InvalidArgumentError):
        parse_retention(retention)
    request = SimpleNamespace(request_id="r1", sampling_params=SimpleNamespace(
        extra_args={"pagedkv": {"retention": retention}}))
    with caplog.at_level(logging.WARNING):
        assert retention_of(request) is None
    assert "retention ignored" in caplog.text


def test_tokens_behind_the_facade_are_refused_before_allocation() -> None:
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    mgr = KVCacheManager.from_spec(spec, num_blocks=16, max_model_len=64)
    req = Request("r", [1, 2, 3], hasher=mgr.hasher)
    mgr.allocate_slots(req, 3)
    req.num_computed_tokens = 3
    free = mgr.pool.free_queue.num_free
    table = list(mgr.get_block_ids("r")[0])
    req.all_token_ids.extend([5, 6, 7, 8, 9])  # behind the facade: no hashes
    for _ in range(2):  # the first call and the compiled fast path's repeat
        with pytest.raises(InvalidArgumentError, match="append_output_tokens"):
            mgr.allocate_slots(req, 1)
    assert mgr.pool.free_queue.num_free == free
    assert list(mgr.get_block_ids("r")[0]) == table
    del req.all_token_ids[3:]
    req.append_output_tokens([5, 6, 7, 8, 9])  # through the facade: works
    assert mgr.allocate_slots(req, 1) is not None
