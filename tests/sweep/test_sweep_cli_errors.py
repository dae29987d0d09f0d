"""Bad input to ``pagedkv sweep``: one line on stderr naming the problem and the fix, exit
1 (a file that cannot be read) or 2 (the caller's mistake: usage, an unknown option or
value, points that contradict), nothing computed."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
from sweep_helpers import SMALL_WORKLOAD, small_grid

from pagedkv.cli import main

W = [f"--set={k.replace('_', '-')}={v}" for k, v in SMALL_WORKLOAD.items()]


def _error(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 1) -> str:
    try:
        got = main(argv)
    except SystemExit as exc:  # usage errors: argparse exits
        got = int(exc.code or 0)
    assert got == code
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["--axis", "colour=red,blue"], 2, "unknown option 'colour'; sweepable options: trace, "),
    (["--axis", "tp=1,x"], 2, "argument --tp: must be a whole number in [1, 1024], got 'x'"),
    (["--axis", "gpu=H100,TPU-v9"], 2, "unknown GPU 'TPU-v9': give one of A100-40GB"),
    (["--axis", "model=Llama-3.1-8B,NoSuchModel-1B"], 1, "NoSuchModel-1B"),
    ([], 2, "the grid has no axis"),
    (["--axis", "tp=1,2", "--axis", "num-blocks=100,200", "--set", "model=Llama-3.1-8B"], 2,
     "point 0 (tp=1 num_blocks=100): give either --num-blocks or --model"),
    (["--axis", "replicas=2", "--axis", "router=compare"], 2, "router 'compare' runs every"),
    (["--axis", "tp=1,2", "--prices", "nope.json"], 1,
     "nope.json: cannot open the price table"),
])
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               args: list[str], code: int, needle: str) -> None:
    line = _error(capsys, ["sweep", *W, "--out", str(tmp_path / "o"), *args], code=code)
    assert line.startswith("pagedkv sweep: error: ")
    assert needle in line
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_bad_grid_file_and_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "g.json"
    bad.write_text('{"tp": [1, 2]')
    assert "g.json:1: not valid JSON" in _error(capsys, ["sweep", str(bad)])
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"limit": 5}))
    assert "the grid has no axis" in _error(capsys, ["sweep", str(empty)], code=2)
    assert "--jobs" in _error(capsys, ["sweep", "--jobs", "0", "--axis", "tp=1"], code=2)
    assert "--slo-ttft-p99-s" in _error(capsys, ["sweep", "--slo-ttft-p99-s", "nan"], code=2)


def test_ray_not_installed_names_the_extra(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    line = _error(capsys, ["sweep", *W, "--axis", "num-blocks=300,400", "--ray",
                           "--out", str(tmp_path / "o")])
    assert line == "pagedkv sweep: error: --ray needs Ray: pip install 'pagedkv[ray]'"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends


def test_unreachable_cluster_is_one_line(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    port = _closed_port()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        line = _error(capsys, ["sweep", *W, "--axis", "num-blocks=300,400", "--ray",
                               address, "--out", str(tmp_path / "o")])
        assert line.startswith(f"pagedkv sweep: error: cannot reach the Ray cluster at "
                               f"{address} (Connection refused)")
    assert "give auto, HOST:PORT" in _error(
        capsys, ["sweep", *W, "--axis", "num-blocks=300", "--ray", "nowhere"])
    assert not (tmp_path / "o").exists()


def test_small_grid_helper_is_a_valid_grid(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text(json.dumps(small_grid()))
    assert main(["sweep", str(tmp_path / "g.json"), "--out", str(tmp_path / "o"),
                 "--jobs", "1", "--no-plot"]) == 0


def test_a_port_that_is_not_ray_fails_in_bounded_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Something listens there but is no Ray cluster (it can hold Ray's client for
    minutes): the trial join in a child process is cut at JOIN_TIMEOUT_S, one line."""
    ray = pytest.importorskip("ray")
    import threading

    from pagedkv.sweep import ray_backend

    assert not ray.is_initialized()
    monkeypatch.setattr(ray_backend, "JOIN_TIMEOUT_S", 6.0)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def answer_and_hang_up() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(b"HTTP/1.1 404 Not Found\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=answer_and_hang_up, daemon=True)
    thread.start()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        with pytest.raises(ray_backend.RayUnreachableError) as info:
            ray_backend.connect(address)
    finally:
        stop.set()
        thread.join()
        server.close()
    assert str(info.value).startswith(f"no Ray cluster answered at {address} within 6 s") \
        or str(info.value).startswith(f"cannot join the Ray cluster at {address}: ")
    assert not ray.is_initialized()


def test_points_are_checked_before_ray_starts(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # a Ray start would fail differently
    line = _error(capsys, ["sweep", *W, "--axis", "num-blocks=300", "--set", "model=Llama-3.1-8B",
                           "--ray", "--out", str(tmp_path / "o")], code=2)
    assert "point 0 (num_blocks=300): give either --num-blocks or --model" in line
