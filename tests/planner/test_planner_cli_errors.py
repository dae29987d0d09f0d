"""Every bad ``pagedkv plan`` invocation, run as a new user would run it (a subprocess):
exactly one line on stderr, exit 1 (the plan cannot be made) or 2 (the caller's mistake,
:func:`pagedkv.cli_args.exit_code`), nothing on stdout, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BAD: list[tuple[str, list[str], int, str]] = [
    # (id, argv (after "plan"; {dir}, {bin}, {latin1}, {list}, {empty} are files), code,
    #  words the message must contain)
    ("directory", ["{dir}", "--kv-cache-memory", "10GiB"], 1,
     "is a directory without a config.json"),
    ("num-blocks-beyond-memory", ["Llama-3.1-8B", "--kv-cache-memory", "50GiB",
                                  "--num-blocks", str(10**15)], 1,
     "lower --num-blocks or give the KV cache more memory"),
    ("bare-number-memory", ["Llama-3.1-8B", "--gpu-memory", "80"], 2,
     "did you mean 80GiB?"),
    ("negative-memory", ["Llama-3.1-8B", "--gpu-memory", "-1GiB"], 2,
     "--gpu-memory: the size must not be negative"),
    ("negative-kv-memory", ["Llama-3.1-8B", "--kv-cache-memory=-5GB"], 2,
     "must not be negative"),
    ("not-a-size", ["Llama-3.1-8B", "--gpu-memory", "lots"], 2, "is not a size"),
    ("binary-config", ["{bin}", "--kv-cache-memory", "10GiB"], 1,
     "a binary file, not text"),
    ("latin1-config", ["{latin1}", "--kv-cache-memory", "10GiB"], 1, "not UTF-8 text"),
    ("json-list-config", ["{list}", "--kv-cache-memory", "10GiB"], 1,
     "expected a JSON object"),
    ("empty-config", ["{empty}", "--kv-cache-memory", "10GiB"], 1, "not valid JSON"),
    ("no-such-model", ["no-such-model", "--kv-cache-memory", "1GB"], 1,
     "no such file and no bundled config"),
    ("max-model-len-over-limit", ["Mistral-7B-v0.1", "--kv-cache-memory", "10GiB",
                                  "--max-model-len", "40000"], 1,
     "above the model's limit of 32,768 tokens"),
    ("max-model-len-zero", ["Llama-3.1-8B", "--kv-cache-memory", "10GiB",
                            "--max-model-len", "0"], 2,
     "--max-model-len: must be a whole number >= 1"),
    ("negative-tp", ["Llama-3.1-8B", "--kv-cache-memory", "10GiB", "--tp", "-2"], 2,
     "--tp: must be a whole number >= 1"),
    ("tp-not-dividing", ["Llama-3.1-70B", "--kv-cache-memory", "10GB", "--tp", "3"], 1,
     "does not divide num_attention_heads = 64"),
    ("not-enough-memory", ["Llama-3.1-70B", "--kv-cache-memory", "1GiB",
                           "--max-model-len", "131072"], 1,
     "the largest max_model_len that fits"),
    ("zero-kv-memory", ["Llama-3.1-8B", "--kv-cache-memory", "0"], 1,
     "not even a one-token request fits"),
    ("weights-exceed-gpu", ["Llama-3.1-70B", "--gpu-memory", "80GB"], 1, "exceed the usable"),
    ("utilization", ["Llama-3.1-8B", "--gpu-memory", "80GB", "--gpu-memory-utilization",
                     "1.2"], 2, "utilization: must be a finite number in (0, 1]"),
    ("backend-cannot-run-it", ["Llama-3.1-8B", "--kv-cache-memory", "10GiB",
                               "--attention-backend", "FLASHMLA"], 1,
     "cannot run standard attention"),
    ("block-size-backend", ["DeepSeek-V3", "--kv-cache-memory", "10GiB", "--kv-dtype", "fp8",
                            "--block-size", "16", "--tp", "8"], 1,
     "FLASHMLA cannot run block size 16"),
    ("mamba-hybrid-off", ["AI21-Jamba-1.5-Mini", "--kv-cache-memory", "10GiB",
                          "--no-hybrid"], 1, "cannot be promoted to one KV-cache type"),
    ("default-memory-too-small", ["Llama-3.1-70B"], 1, "exceed the usable"),
    ("both-memories", ["Llama-3.1-8B", "--gpu-memory", "80GiB", "--kv-cache-memory",
                       "1GiB"], 2, "not allowed with"),
    ("unknown-flag", ["Llama-3.1-8B", "--kv-cache-memory", "1GiB", "--frobnicate"], 2,
     "unrecognized arguments"),
    ("tp-not-int", ["Llama-3.1-8B", "--kv-cache-memory", "1GiB", "--tp", "two"], 2,
     "must be a whole number"),
    ("unknown-gpu", ["Llama-3.1-8B", "--kv-cache-memory", "1GiB", "--gpu", "tpu"], 2,
     "unknown GPU 'tpu'"),
    ("misspelled-gpu", ["Llama-3.1-8B", "--gpu", "b20"], 2, "did you mean 'B200'"),
    ("misspelled-flag", ["Llama-3.1-8B", "--max-modle-len", "4096"], 2,
     "did you mean --max-model-len? (see 'pagedkv plan --help')"),
    ("unknown-ssm-dtype", ["Jamba", "--kv-cache-memory", "1GiB", "--mamba-ssm-cache-dtype",
                           "int8"], 2, "invalid choice"),
    ("missing-value", ["Llama-3.1-8B", "--gpu-memory"], 2, "expected one argument"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad")
    (root / "folder").mkdir()
    (root / "model.bin").write_bytes(bytes(range(256)) * 64)
    (root / "latin1.json").write_bytes('{"model_type": "llamé"}'.encode("latin-1"))
    (root / "list.json").write_text(json.dumps([1, 2, 3]))
    (root / "empty.json").write_text("")
    return {"dir": str(root / "folder"), "bin": str(root / "model.bin"),
            "latin1": str(root / "latin1.json"), "list": str(root / "list.json"),
            "empty": str(root / "empty.json")}


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pagedkv", "plan", *argv],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("argv", "code", "words"), [case[1:] for case in BAD],
                         ids=[case[0] for case in BAD])
def test_bad_invocation(files: dict[str, str], argv: list[str], code: int,
                        words: str) -> None:
    result = _run([arg.format(**files) for arg in argv])
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(("pagedkv plan: error: ", "pagedkv: error: "))
    assert words in result.stderr


def test_a_folder_with_config_json_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "Some-Model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "hidden_size": 256, "max_position_embeddings": 4096,
        "vocab_size": 1000, "intermediate_size": 512}))
    result = _run([str(folder), "--kv-cache-memory", "1GiB", "--json"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["name"] == "Some-Model"


@pytest.mark.parametrize(("size", "num_bytes"), [
    ("80G", 80 << 30), ("80GB", 80 * 10**9), ("80GiB", 80 << 30), ("1T", 1 << 40),
    ("1TB", 10**12), ("1TiB", 1 << 40),
])
def test_units(size: str, num_bytes: int) -> None:
    from pagedkv.planner import parse_bytes

    assert parse_bytes(size) == num_bytes
