"""Adversarial inputs, by class, across every command and configuration object.

Classes tried: NaN, infinities, negative, zero where meaningless, huge, not a number,
bool given as a number (and a number given as a flag), nested values (lists, dicts) and
binary values (bytes, undecodable text).

* every command: a bad numeric option is refused with exit 2 (usage) or 1 (the request
  cannot be served), exactly one line on stderr naming the problem, no traceback, and it
  returns (run in-process through ``pagedkv.cli.main``; nothing reaches a replay);
* every configuration object: a bad field value raises a :class:`~pagedkv.PagedKVError`
  (``InvalidArgumentError`` or ``ConfigError``) whose message names the field — never a
  ``TypeError``/``AttributeError`` at construction, nor a value accepted to fail later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
from collections.abc import Callable
from typing import Any

import pytest

from pagedkv import CacheConfig, FullAttentionSpec, PagedKVError
from pagedkv.bench import BenchConfig
from pagedkv.cli import main
from pagedkv.cluster.router import CostWeights, ReplicaLoad
from pagedkv.events import KVEventsConfig
from pagedkv.host import HostTierConfig
from pagedkv.observe import ObserveConfig
from pagedkv.retention import RetentionConfig
from pagedkv.sim.api import SimConfig
from pagedkv.sim.host_tier import HostMemoryConfig
from pagedkv.sim.scheduler import SchedulerConfig, StepTimeModel

# --- commands ---------------------------------------------------------------------------

SIM = ["simulate", "--no-plots", "--no-progress", "--no-bounds", "--limit", "3",
       "--num-blocks", "64"]
GEN = [*SIM, "--generator", "multi-turn"]
PLAN = ["plan", "Llama-3.1-8B", "--gpu-memory", "80GB"]
SERVE = ["index", "serve", "--redis", "redis://127.0.0.1:1", "--subscribe",
         "p=tcp://127.0.0.1:9"]
QUERY = ["index", "query", "--redis", "redis://127.0.0.1:1", "--hashes", "1,2"]
BENCH = ["bench"]

#: (command line before the option, option) for every decimal option of every command.
FLOAT_OPTIONS = [
    (SIM, "--session-stagger-s"), (GEN, "--interval-s"), (GEN, "--think-s"),
    (SIM, "--gpu-memory-utilization"), (SIM, "--rate-scale"), (SIM, "--step-overhead-ms"),
    (SIM, "--prefill-token-us"), (SIM, "--decode-seq-us"), (SIM, "--warmup-fraction"),
    ([*SIM, "--metrics-port", "0"], "--metrics-linger-s"),
    ([*SIM, "--host-memory", "1GiB"], "--host-bandwidth-gbps"),
    (PLAN, "--gpu-memory-utilization"),
    (SERVE, "--status-every"), (SERVE, "--request-timeout"), (SERVE, "--max-seconds"),
    (SERVE, "--writer-lease"),
]
FLOAT_VALUES = ["nan", "NaN", "inf", "-inf", "1e999", "-1", "1e300", "abc", "", "0x10",
                "\udcff", "[1]"]

#: (command line before the option, option) for whole-number options whose value must
#: be positive (and bounded).
INT_OPTIONS = [
    (SIM, "--trace-block-size"), (SIM, "--block-size"), (SIM, "--tp"),
    (SIM, "--token-budget"), (SIM, "--max-running"), (SIM, "--jobs"), (SIM, "--replicas"),
    (SIM, "--limit"), ([*SIM[:-2]], "--num-blocks"), (GEN, "--sessions"), (GEN, "--turns"),
    (GEN, "--shared-tokens"), (GEN, "--message-tokens"), (GEN, "--output-tokens"),
    ([*SIM[:-2], "--generator", "system-prompts"], "--groups"),
    ([*SIM[:-2], "--generator", "system-prompts"], "--per-group"),
    (PLAN, "--tp"), (PLAN, "--max-model-len"), (PLAN, "--block-size"),
    (PLAN, "--num-blocks"), (PLAN, "--max-num-batched-tokens"),
    (BENCH, "--num-blocks"), (BENCH, "--block-size"), (BENCH, "--concurrency"),
    (BENCH, "--repeat"), (BENCH, "--num-requests"),
    (QUERY, "--block-size"), (QUERY, "--num-tokens"), (SERVE, "--metrics-port"),
    ([*SIM, "--explain-misses"], "--ghost-entries"),
]
INT_VALUES = ["nan", "1.5", "-1", "0", "99999999999999999999999", "", "abc", "\udcff"]
# 0 is a meaningful value of these (a free port; no ghost entries):
ZERO_OK = {"--metrics-port", "--ghost-entries"}


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``pagedkv ARGV`` in-process: (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


def assert_refused(argv: list[str]) -> None:
    code, err = run_cli(argv)
    lines = err.strip().splitlines()
    assert code in (1, 2), (argv, code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(lines) == 1, (argv, lines)
    assert lines[0].startswith("pagedkv") and "error:" in lines[0], lines


@pytest.mark.parametrize("value", FLOAT_VALUES, ids=repr)
@pytest.mark.parametrize(("base", "flag"), FLOAT_OPTIONS,
                         ids=[f"{b[0]}{f}" for b, f in FLOAT_OPTIONS])
def test_decimal_options_refuse_bad_values(base: list[str], flag: str, value: str) -> None:
    assert_refused([*base, flag, value])


@pytest.mark.parametrize("value", INT_VALUES, ids=repr)
@pytest.mark.parametrize(("base", "flag"), INT_OPTIONS,
                         ids=[f"{b[0]}{f}" for b, f in INT_OPTIONS])
def test_whole_number_options_refuse_bad_values(base: list[str], flag: str,
                                                value: str) -> None:
    if value == "0" and flag in ZERO_OK:
        pytest.skip(f"{flag} 0 is meaningful")
    if value == "99999999999999999999999" and flag in ("--max-num-batched-tokens", "--limit"):
        pytest.skip(f"a huge {flag} is a valid input (a plan's budget; all requests)")
    assert_refused([*base, flag, value])


@pytest.mark.parametrize("argv", [
    ["index", "query", "--redis", "redis://127.0.0.1:1", "--tokens", "@/dev/zero"],
    ["index", "query", "--redis", "redis://127.0.0.1:1", "--tokens", "1," * 3 + "x"],
    ["index", "query", "--redis", "redis://127.0.0.1:1", "--hashes", "9" * 5000],
    ["index", "query", "--redis", "redis://127.0.0.1:1", "--hashes", "-1"],
    ["index", "serve", "--redis", "redis://127.0.0.1:1", "--subscribe", "nonsense"],
    ["index", "serve", "--redis", "not-a-url", "--subscribe", "p=tcp://127.0.0.1:9"],
    [*SIM, "--capacity-sweep", "nan", "--mode", "pure-cache"],
    [*SIM, "--ttft-p99", "inf", "--find-capacity"],
    [*SIM, "--host-memory", "nanGiB"],
    [*SIM, "--kv-events-endpoint", "tcp://*:1"],  # beyond loopback without the opt-in
    [*SIM, "--kv-events-endpoint", "bogus://x"],
], ids=lambda a: " ".join(a[-2:])[:40])
def test_other_bad_inputs_are_one_line_errors(argv: list[str]) -> None:
    assert_refused(argv)


@pytest.mark.parametrize("text", [
    "[" * 100_000,                   # nested past the parser's recursion
    '{"timestamp": NaN, "input_length": 1, "output_length": 1, "hash_ids": [1]}',
    '{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 1}',
    "\x00\xff\xfe binary",
], ids=["deep", "nan", "huge-int", "binary"])
def test_bad_trace_lines_are_one_line_errors(tmp_path: Any, text: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if text.isascii()
                     else text.encode("latin-1"))
    assert_refused([*SIM, "--trace", str(path), "--trace-format", "mooncake"])


@pytest.mark.parametrize("text", ["[" * 100_000, '{"model_type": NaN}',
                                  '{"num_hidden_layers": ' + "9" * 5000 + "}"],
                         ids=["deep", "nan", "huge-int"])
def test_bad_model_configs_are_one_line_errors(tmp_path: Any, text: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    assert_refused(["plan", str(path), "--kv-cache-memory", "1GiB"])


# --- configuration objects --------------------------------------------------------------

SPEC = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype_bytes=1)

#: Each configuration object with the arguments it needs; every field is probed.
CONFIGS: dict[type, dict[str, Any]] = {
    CacheConfig: {"groups": (SPEC,), "num_blocks": 10, "max_model_len": 64},
    RetentionConfig: {}, ObserveConfig: {}, KVEventsConfig: {},
    HostTierConfig: {"num_blocks": 4}, HostMemoryConfig: {"memory_bytes": 1 << 30},
    SchedulerConfig: {}, StepTimeModel: {}, SimConfig: {},
    BenchConfig: {}, ReplicaLoad: {}, CostWeights: {},
}

NESTED_AND_BINARY = [[1], {"a": 1}, (1, 2), b"\x00\xff", bytearray(b"x"), object()]
BAD_BY_KIND: dict[str, list[Any]] = {
    "int": [math.nan, math.inf, -1, True, 1.5, "1", 2**70, *NESTED_AND_BINARY],
    "float": [math.nan, math.inf, -math.inf, -1, True, "1", 1e300, *NESTED_AND_BINARY],
    "bool": [1, 0, "yes", math.nan, *NESTED_AND_BINARY],
    "str": [5, math.nan, True, *NESTED_AND_BINARY],
    "object": [5, math.nan, "x", True, *NESTED_AND_BINARY],
}
#: Fields whose range includes a value above: not a bad value for them.
_HUGE = 2**70
_INT_BAD = BAD_BY_KIND["int"]
ALLOWED_VALUES = [("BenchConfig", "seed", _INT_BAD[2]),  # -1: any seed
                  ("CacheConfig", "num_hash_lookahead_tokens", _INT_BAD[6]),
                  ("CacheConfig", "max_in_flight_tokens", _INT_BAD[6]),
                  ("CacheConfig", "secret_seed", NESTED_AND_BINARY[3]),  # bytes: a seed
                  ("RetentionConfig", "tenant_quota_blocks", NESTED_AND_BINARY[1]),
                  ("HostMemoryConfig", "sweep_memory_bytes", NESTED_AND_BINARY[2])]
#: Fields whose message names the command-line flag they come from.
FLAG_OF = {("HostMemoryConfig", "memory_bytes"): "--host-memory",
           ("HostMemoryConfig", "sweep_memory_bytes"): "--host-memory",
           ("HostMemoryConfig", "bandwidth_gbps"): "--host-bandwidth-gbps",
           ("HostMemoryConfig", "write_policy"): "--host-write-policy",
           ("SimConfig", "capacity_sweep"): "--capacity-sweep"}


def _kind(annotation: str) -> str:
    base = annotation.replace(" | None", "")
    return base if base in ("int", "float", "bool", "str") else "object"


def _cases() -> list[tuple[type, str, Any]]:
    out = []
    for cls in CONFIGS:
        hints = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        for name, annotation in hints.items():
            for value in BAD_BY_KIND[_kind(annotation)]:
                if not any(c == cls.__name__ and f == name and v is value
                           for c, f, v in ALLOWED_VALUES):
                    out.append((cls, name, value))
    return out


CASES = _cases()


@pytest.mark.parametrize(("cls", "field", "value"), CASES,
                         ids=[f"{c.__name__}.{f}={v!r:.12}" for c, f, v in CASES])
def test_config_fields_refuse_bad_values_by_name(cls: type, field: str, value: Any) -> None:
    args = {**CONFIGS[cls], field: value}
    with pytest.raises(PagedKVError) as info:
        cls(**args)
    message = str(info.value)
    names = (field, field.replace("_", "-"), FLAG_OF.get((cls.__name__, field), field))
    assert any(n in message for n in names) or "tenant" in message, message


def test_every_config_object_is_probed() -> None:
    """A new configuration dataclass must be added to CONFIGS (and so be probed)."""
    import pkgutil

    import pagedkv

    found = set()
    for mod in pkgutil.walk_packages(pagedkv.__path__, "pagedkv."):
        if mod.name.startswith(("pagedkv.torch", "pagedkv.sim.plots")) or \
                mod.name.endswith("__main__"):
            continue
        try:
            module = __import__(mod.name, fromlist=["_"])
        except ImportError:
            continue
        for obj in vars(module).values():
            if (isinstance(obj, type) and dataclasses.is_dataclass(obj)
                    and obj.__module__ == mod.name and obj.__name__.endswith("Config")):
                found.add(obj)
    assert found <= set(CONFIGS), sorted(c.__name__ for c in found - set(CONFIGS))


CALLS: list[tuple[str, Callable[[], object]]] = [
    ("ObserveConfig clock", lambda: ObserveConfig(clock=5)),  # type: ignore[arg-type]
    ("RetentionConfig clock", lambda: RetentionConfig(clock="now")),  # type: ignore[arg-type]
    ("CacheConfig groups", lambda: CacheConfig(groups=(SPEC, "full"),  # type: ignore[arg-type]
                                               num_blocks=10, max_model_len=64)),
    ("CacheConfig groups str", lambda: CacheConfig(groups="full",  # type: ignore[arg-type]
                                                   num_blocks=10, max_model_len=64)),
]


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[c[0] for c in CALLS])
def test_issue_cases_are_refused_at_construction(name: str, call: Callable[[], object]) -> None:
    with pytest.raises(PagedKVError):
        call()

