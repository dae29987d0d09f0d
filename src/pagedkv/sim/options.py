"""Every option of ``pagedkv simulate``, declared once.

:data:`OPTIONS` is a table of :class:`Option` records (flag, destination, group, the
conversion from :mod:`pagedkv.cli_args`, default, choices, help); it is the only place
the command's options exist. :func:`add_simulate_options` builds the argparse groups from
it, :func:`parse_option_value` converts one option's text exactly as the command line
would (for sweeps over any option), and :func:`pagedkv.sim.setup.simulate_request` turns
the parsed values into what a run needs.

>>> parse_option_value("--rate-scale", "2")
2.0
>>> parse_option_value("block_size", "32")
32
>>> parse_option_value("--block-size", "x")
Traceback (most recent call last):
...
pagedkv.errors.InvalidArgumentError: argument --block-size: invalid int value: 'x'
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagedkv.cli_args import MAX_SECONDS, number_arg, seconds_arg, whole_arg
from pagedkv.errors import InvalidArgumentError, PagedKVError
from pagedkv.planner.args import check_size, gpu_arg, size_arg
from pagedkv.planner.gpus import DEFAULT_GPU, GPUS
from pagedkv.sim.clock import STEP_MODELS
from pagedkv.sim.clock.constants import CONSTANT_SETS
from pagedkv.sim.generators import GENERATORS
from pagedkv.sim.host_tier import DEFAULT_BANDWIDTH_GBPS, WRITE_POLICIES, parse_host_sizes
from pagedkv.sim.loaders import formats
from pagedkv.sim.models import DEFAULT_GPU_MEMORY, DEFAULT_MODEL
from pagedkv.sim.retention_support import POLICIES
from pagedkv.sim.scheduler import StepTimeModel
from pagedkv.sim.semantics import SEMANTICS

__all__ = ["DEFAULT_CALIBRATION_FILE", "DESCRIPTION", "GROUPS", "MAX_REPLICAS", "OPTIONS",
           "ROUTERS", "Option", "add_simulate_options", "check_option_value", "defaults",
           "option", "parse_option_value"]

DESCRIPTION = (
    "Replay a workload through a continuous-batching scheduler (engine mode) or "
    "lookup-store-free (pure-cache mode) on the KV-cache manager, and report the "
    "prefix-cache hit rate beside the Belady optimum and the infinite-cache "
    "ceiling, KV usage, evictions, preemptions, queueing and TTFT. With no "
    "arguments: the bundled head of Mooncake's conversation trace, on the capacity "
    f"of {DEFAULT_MODEL} on one {DEFAULT_GPU_MEMORY} GPU."
)
DEFAULT_CALIBRATION_FILE = "pagedkv-calibration.json"
ROUTERS = ("round-robin", "least-loaded", "cache-aware", "compare")
#: At most this many simulated replicas (each holds a manager and a queue in memory).
MAX_REPLICAS = 4096

#: Group key -> (title, description), in the order ``--help`` lists them.
GROUPS: dict[str, tuple[str, str | None]] = {
    "workload": ("workload (default: the bundled Mooncake conversation head)", None),
    "generator": ("generator parameters (defaults per generator; see docs)", None),
    "capacity": ("cache capacity", None),
    "engine": ("engine", None),
    "output": ("analysis and output", None),
    "events": ("KV-cache events (engine mode; needs pagedkv[events])", None),
    "replicas": ("multiple replicas (engine mode; pagedkv.cluster)",
                 "Each replica: one full-attention group of --block-size tokens per block, "
                 "sized by --num-blocks or the --model plan (a hybrid plan as one "
                 "full-attention group of its token slots), with --token-budget, "
                 "--max-running and the step-time flags. Requests arrive at their trace "
                 "times: --rate-scale and --arrivals do not apply."),
    "observe": ("why the cache missed, and Prometheus metrics (engine mode)", None),
    "host": ("host-memory tier (engine mode)", None),
}


@dataclass(frozen=True, slots=True)
class Option:
    """One option: ``flag`` (``--name``), argparse ``dest`` (default: the flag's name with
    ``_``), ``group`` (a :data:`GROUPS` key), ``type`` (the text's conversion; None:
    text), ``action`` ("store" or "store_true"), ``exclusive`` (in the group's
    mutually exclusive set)."""

    flag: str
    help: str
    group: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    action: str = "store"
    nargs: str | None = None
    const: Any = None
    exclusive: bool = False
    dest: str = ""

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.flag[2:].replace("-", "_"))
        if self.action == "store_true" and self.default is None:
            object.__setattr__(self, "default", False)


def _host_sizes(text: str) -> tuple[int, ...]:
    try:
        for part in text.split(","):
            check_size(part)  # the one size rule: negative, a bare number without a unit
        return parse_host_sizes(text)
    except PagedKVError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_D = StepTimeModel()
_GEN = "generator"
_FLAG = "store_true"

OPTIONS: tuple[Option, ...] = (
    # workload
    Option("--trace", "a trace file (Mooncake JSONL, Azure CSV, kv-cache-tester session "
           "JSON; .gz too), a directory of session files, or a glob", "workload",
           metavar="PATH", exclusive=True),
    Option("--generator", "a synthetic workload with an analytic ideal hit rate", "workload",
           choices=tuple(sorted(GENERATORS)), exclusive=True),
    Option("--trace-format", "trace format (default: detected from the content, else the "
           "name)", "workload", default="auto", choices=("auto", *formats())),
    Option("--session-stagger-s", "several files: file k starts k*S seconds after the "
           "first (default 0)", "workload",
           type=seconds_arg("--session-stagger-s", allow_zero=True), default=0.0,
           metavar="S"),
    Option("--trace-block-size", "tokens per hash_ids entry of a JSONL trace (default 512)",
           "workload", type=whole_arg("--trace-block-size", minimum=1, maximum=10_000_000),
           default=512, metavar="TOKENS"),
    Option("--limit", "replay only the first N requests", "workload", type=int,
           metavar="N"),
    Option("--skip-bad-lines", "skip and count malformed trace lines instead of failing",
           "workload", action=_FLAG),
    # generator parameters
    Option("--groups", "system-prompts: system prompts", _GEN, type=int, metavar="N"),
    Option("--per-group", "system-prompts: questions per system prompt", _GEN, type=int,
           metavar="N"),
    Option("--sessions", "multi-turn: conversations; agent: agents", _GEN, type=int,
           metavar="N"),
    Option("--turns", "multi-turn: turns; agent: steps", _GEN, type=int, metavar="N"),
    Option("--shared-tokens", "shared system prompt / tool prefix length", _GEN, type=int,
           metavar="TOKENS"),
    Option("--message-tokens", "question / user message / observation length", _GEN,
           type=int, metavar="TOKENS"),
    Option("--first-tokens", "agent: task length", _GEN, type=int, metavar="TOKENS"),
    Option("--output-tokens", "answer / reply / action length", _GEN, type=int,
           metavar="TOKENS"),
    Option("--interval-s", "seconds between request (session) starts", _GEN,
           type=seconds_arg("--interval-s", allow_zero=True), metavar="S"),
    Option("--think-s", "multi-turn, agent: seconds from a reply to the next turn", _GEN,
           type=seconds_arg("--think-s", allow_zero=True), metavar="S"),
    # cache capacity
    Option("--block-size", "tokens per block (default 16; a divisor or multiple of the "
           "trace's hash block size)", "capacity", type=int, default=16, metavar="TOKENS"),
    Option("--num-blocks", "blocks in the pool, the null block included", "capacity",
           type=int, metavar="N"),
    Option("--model", f"size the pool with the planner: config.json or bundled name "
           f"(default without --num-blocks: {DEFAULT_MODEL})", "capacity", metavar="MODEL"),
    Option("--gpu-memory", f"GPU memory for --model (default: the --gpu's, "
           f"{DEFAULT_GPU_MEMORY} for the default {DEFAULT_GPU})", "capacity",
           type=size_arg("--gpu-memory"), metavar="SIZE"),
    Option("--gpu-memory-utilization", "share of GPU memory the engine may use (default "
           "0.9)", "capacity", type=number_arg("--gpu-memory-utilization", minimum=0,
                                               minimum_exclusive=True, maximum=1),
           default=0.9, metavar="FRACTION"),
    Option("--max-model-len", "longest request (prompt + output tokens) the engine takes: "
           "a longer one is rejected on arrival, as vLLM's server refuses it, and counted "
           "by reason (default: the model's context, max_position_embeddings; engine mode "
           "with --model)", "capacity", type=whole_arg("--max-model-len", minimum=1),
           metavar="TOKENS"),
    Option("--tp", "tensor-parallel size for --model (default 1)", "capacity",
           type=whole_arg("--tp", minimum=1, maximum=1024), default=1, metavar="N"),
    # engine
    Option("--semantics", "vllm: full blocks only, the last token recomputed (default); "
           "reference: every hash id incl. the partial last block is stored and credited, "
           "as in the published Mooncake curves (pure-cache mode)", "engine",
           default="vllm", choices=tuple(SEMANTICS)),
    Option("--mode", "engine: continuous batching with a simulated clock (default); "
           "pure-cache: lookup, store, free, one request at a time", "engine",
           default="engine", choices=("engine", "pure-cache")),
    Option("--token-budget", "tokens computed per step (default 8192)", "engine", type=int,
           default=8192, metavar="TOKENS"),
    Option("--max-running", "most requests running at once (default 256)", "engine",
           type=int, default=256, metavar="N"),
    Option("--rate-scale", "arrival rate multiplier: 2 = twice as fast (default 1)",
           "engine", type=number_arg("--rate-scale", minimum=0, minimum_exclusive=True,
                                     maximum=1e6), default=1.0, metavar="X"),
    Option("--arrivals", "arrival times from the workload (default) or all at time 0",
           "engine", default="trace", choices=("trace", "at-once")),
    Option("--gpu", f"the GPU: one of {', '.join(GPUS)} (default {DEFAULT_GPU}), a family "
           "(hopper, ampere, blackwell, ada, cdna3) or short name (h100, b200; any case), "
           "or a JSON spec; sets the clock's peaks and, without --gpu-memory, the memory",
           "engine", type=gpu_arg("--gpu"), metavar="NAME|SPEC.json"),
    Option("--step-model", "auto (default): the roofline clock whenever the model is known "
           "(not with --num-blocks); linear: the fixed per-step/token/sequence costs",
           "engine", choices=tuple(STEP_MODELS)),
    Option("--calibration", f"roofline constants: {', '.join(CONSTANT_SETS)} (default "
           "'default'), or a file written by --calibrate", "engine", metavar="SET|FILE"),
    Option("--calibrate", "fit the roofline constants to `vllm bench serve` (--save-result "
           "--save-detailed) or GuideLLM result files for --model/--gpu/--tp, write them "
           "(--save-calibration) and stop", "engine", nargs="+", metavar="MEASURED"),
    Option("--save-calibration", f"where --calibrate writes (default "
           f"./{DEFAULT_CALIBRATION_FILE})", "engine", default=DEFAULT_CALIBRATION_FILE,
           metavar="FILE"),
    Option("--step-overhead-ms", f"linear step model: per step (default "
           f"{_D.step_overhead_s * 1e3:g} ms; implies --step-model linear)", "engine",
           type=number_arg("--step-overhead-ms", minimum=0, maximum=MAX_SECONDS),
           metavar="MS"),
    Option("--prefill-token-us", f"linear: per prefill token (default "
           f"{_D.prefill_token_s * 1e6:g} µs)", "engine",
           type=number_arg("--prefill-token-us", minimum=0, maximum=MAX_SECONDS),
           metavar="US"),
    Option("--decode-seq-us", f"linear: per decoding sequence (default "
           f"{_D.decode_seq_s * 1e6:g} µs)", "engine",
           type=number_arg("--decode-seq-us", minimum=0, maximum=MAX_SECONDS), metavar="US"),
    # analysis and output
    Option("--capacity-sweep", "also report pure-cache hit rate vs capacity (LRU, Belady, "
           "infinite); default capacities 1e4,1e5,1e6,3e6,1e7,unlimited tokens", "output",
           nargs="?", const="default", metavar="TOKENS,..."),
    Option("--jobs", "processes for capacity-sweep points and bounds (default: CPU count)",
           "output", type=int, metavar="N"),
    Option("--find-capacity", "also search the cheapest deployment (GPU, TP, replicas, "
           "router, KV memory) "
           "meeting --ttft-p99 and --tpot-p99", "output", action=_FLAG),
    Option("--ttft-p99", "TTFT p99 target for --find-capacity (default 2s)", "output",
           default="2s", metavar="DURATION"),
    Option("--tpot-p99", "TPOT p99 target for --find-capacity (default 100ms)", "output",
           default="100ms", metavar="DURATION"),
    Option("--no-find-capacity", "skip the search a saturated bundled default run does "
           "by itself", "output", action=_FLAG),
    Option("--ray", "replay the deployment search's candidates as Ray tasks (pagedkv[ray]): "
           "auto = the running cluster, else a local Ray on 127.0.0.1; or HOST:PORT",
           "output", nargs="?", const="auto", metavar="auto|ADDRESS"),
    Option("--warmup-fraction", "'after warm-up' rates count requests from this fraction "
           "on (default 0.5)", "output",
           type=number_arg("--warmup-fraction", minimum=0, maximum=1,
                           maximum_exclusive=True), default=0.5, metavar="F"),
    Option("--no-bounds", "skip the Belady and infinite-cache bounds", "output",
           action=_FLAG),
    Option("--json", "print JSON instead of tables", "output", action=_FLAG),
    Option("--plot-dir", "where PNG plots go (default ./pagedkv-report)", "output",
           default="pagedkv-report", metavar="DIR"),
    Option("--no-plots", "write no plots", "output", action=_FLAG),
    Option("--no-progress", "no progress bar", "output", action=_FLAG),
    Option("--quiet", "for scripts: no progress and no search log on stderr (the report, "
           "notes and errors still print)", "output", action=_FLAG),
    Option("--retention", "also replay the workload in pure-cache mode under this "
           "retention policy and under LRU at the same capacity, and report both beside "
           "Belady: " + ", ".join(POLICIES) + " (see docs/retention.md)", "output",
           choices=tuple(POLICIES), metavar="POLICY"),
    Option("--check-invariants", "debug: walk the manager's state after every step (slow)",
           "output", action=_FLAG),
    # KV-cache events
    Option("--kv-events-endpoint", "publish the simulated engine's KV-cache events live on "
           "this ZeroMQ PUB endpoint in vLLM's wire format (e.g. tcp://127.0.0.1:5557)",
           "events", metavar="ENDPOINT"),
    Option("--kv-events-replay-endpoint", "ROUTER endpoint serving replay and snapshot "
           "requests", "events", metavar="ENDPOINT"),
    Option("--kv-events-topic", "topic frame, e.g. kv@pod@model", "events", default=""),
    Option("--kv-events-form", "map: vLLM >= 0.24; array: vLLM <= 0.23", "events",
           default="map", choices=("map", "array")),
    Option("--kv-events-allow-remote", "allow endpoints that listen beyond this host "
           "(tcp://*:PORT, 0.0.0.0): the messages carry prompt token ids, unauthenticated",
           "events", action=_FLAG),
    # replicas
    Option("--replicas", "simulate N engine replicas behind a router instead of one engine",
           "replicas", type=whole_arg("--replicas", minimum=1, maximum=MAX_REPLICAS),
           metavar="N"),
    Option("--router", "routing policy for --replicas, or 'compare' to run all three "
           "(default: compare)", "replicas", choices=ROUTERS),
    # observe
    Option("--explain-misses", "attribute every missed prompt token to a reason (never "
           "seen, evicted, isolated by a salt, partial block, hybrid clamps...): a table, a "
           "one-line reading and a plot of missed tokens by reason over time", "observe",
           action=_FLAG),
    Option("--ghost-entries", "with --explain-misses: evictions remembered to tell "
           "'evicted' from 'never seen' (default 1,000,000, about 270 MB)", "observe",
           type=int, default=1_000_000, metavar="N"),
    Option("--metrics-port", "serve Prometheus metrics of the replay on 127.0.0.1:PORT (0: "
           "a free port, printed); needs pagedkv[metrics]", "observe", type=int,
           metavar="PORT"),
    Option("--metrics-linger-s", "with --metrics-port: keep serving S seconds after the "
           "replay (default 0)", "observe",
           type=seconds_arg("--metrics-linger-s", allow_zero=True), default=0.0,
           metavar="S"),
    # host-memory tier
    Option("--host-memory", "keep blocks evicted from the GPU in this much CPU memory and "
           "load hits from it (e.g. 256GiB; bytes per block from --model's page size, else "
           "128 KiB per token); a table compares it with a device-only replay and any "
           "further sizes (default: off)", "host", type=_host_sizes,
           metavar="SIZE[,SIZE...]"),
    Option("--host-bandwidth-gbps", f"host <-> GPU copy rate in GB/s per direction "
           f"(default {DEFAULT_BANDWIDTH_GBPS:g})", "host",
           type=number_arg("--host-bandwidth-gbps", minimum=0, minimum_exclusive=True,
                           maximum=1e6), metavar="GBPS"),
    Option("--no-host-baseline", "skip the device-only replay the host table compares with",
           "host", action=_FLAG),
    Option("--host-write-policy", "on-eviction: copy a block out when the GPU evicts it "
           "(the step reusing it waits; default); write-through: copy every block as it is "
           "cached (overlaps the next step)", "host", choices=tuple(WRITE_POLICIES)),
)

_BY_NAME: dict[str, Option] = {
    **{o.dest: o for o in OPTIONS}, **{o.flag: o for o in OPTIONS}}


def option(name: str) -> Option:
    """The option named by its flag (``--block-size``) or dest (``block_size``).

    Raises:
        InvalidArgumentError: no such simulate option.
    """
    found = _BY_NAME.get(name)
    if found is None:
        raise InvalidArgumentError(f"{name!r} is not a simulate option; see "
                                   "`pagedkv simulate --help`")
    return found


def defaults() -> dict[str, Any]:
    """Every option's dest -> its default (what an empty command line parses to)."""
    return {o.dest: o.default for o in OPTIONS}


def add_simulate_options(parser: argparse.ArgumentParser) -> None:
    """Add every :data:`OPTIONS` entry to ``parser``, in its :data:`GROUPS` group."""
    groups = {key: parser.add_argument_group(title, desc)
              for key, (title, desc) in GROUPS.items()}
    exclusive: dict[str, Any] = {}
    for o in OPTIONS:
        target: Any = groups[o.group]
        if o.exclusive:
            if o.group not in exclusive:
                exclusive[o.group] = target.add_mutually_exclusive_group()
            target = exclusive[o.group]
        kwargs: dict[str, Any] = {"help": o.help, "default": o.default}
        if o.action == "store_true":
            kwargs["action"] = "store_true"
        else:
            for key in ("type", "choices", "metavar", "nargs", "const"):
                if getattr(o, key) is not None:
                    kwargs[key] = getattr(o, key)
        target.add_argument(o.flag, **kwargs)


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def parse_option_value(name: str, text: str) -> Any:
    """``text`` converted as the command line converts option ``name`` (flag or dest):
    the same type, range and choices, and argparse's message on a bad value. A switch
    (``--json``) takes true/yes/on/1 or false/no/off/0; ``--calibrate`` (several files)
    a comma-separated list.

    >>> parse_option_value("--host-memory", "1GiB,2GiB")
    (1073741824, 2147483648)
    >>> parse_option_value("--no-plots", "yes")
    True

    Raises:
        InvalidArgumentError: an unknown option, or a value the command line refuses
            (``argument --flag: why``).
    """
    o = option(name)
    if not isinstance(text, str):
        raise InvalidArgumentError(f"argument {o.flag}: the value must be text, got "
                                   f"{type(text).__name__}")
    if o.action == "store_true":
        low = text.strip().lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise InvalidArgumentError(f"argument {o.flag}: a switch takes true or false, got "
                                   f"{text!r}")
    if o.nargs == "+":
        return [_convert(o, part.strip()) for part in text.split(",")]
    return _convert(o, text)


def check_option_value(name: str, value: Any) -> None:
    """Refuse a value option ``name`` could not have parsed to (for values given by a
    program, not typed): a switch must be a bool, a text option text, a numeric option
    a number (not a bool) the command line would accept as written, ``--calibrate`` a
    list of texts, ``--host-memory`` a tuple of byte counts; None only where the default
    is None.

    >>> check_option_value("--block-size", 16.5)
    Traceback (most recent call last):
    ...
    pagedkv.errors.InvalidArgumentError: argument --block-size: invalid int value: '16.5'

    Raises:
        InvalidArgumentError: naming the option and what it takes.
    """
    o = option(name)
    if value is None and o.default is None:
        return
    shaped = {"store_true": (isinstance(value, bool), "true or false"),
              "list": (_is_seq(value, str), "a list of texts"),
              "sizes": (_is_seq(value, int), "a tuple of byte counts")}
    shape = ("store_true" if o.action == "store_true" else "list" if o.nargs == "+"
             else "sizes" if o.dest == "host_memory" else None)
    if shape is not None:
        ok, what = shaped[shape]
        if not ok:
            raise InvalidArgumentError(f"argument {o.flag}: takes {what}, got {value!r}")
        return
    if o.type is None or getattr(o.type, "returns_text", False):
        if not isinstance(value, str):
            raise InvalidArgumentError(f"argument {o.flag}: takes text, got {value!r}")
        _convert(o, value)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"argument {o.flag}: takes a number, got {value!r}")
    _convert(o, str(value))


def _is_seq(value: Any, kind: type) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(x, kind) and not isinstance(x, bool) for x in value)


def _convert(o: Option, text: str) -> Any:
    value: Any = text
    if o.type is not None:
        try:
            value = o.type(text)
        except argparse.ArgumentTypeError as exc:
            raise InvalidArgumentError(f"argument {o.flag}: {exc}") from None
        except (TypeError, ValueError):
            kind = getattr(o.type, "__name__", repr(o.type))
            raise InvalidArgumentError(
                f"argument {o.flag}: invalid {kind} value: {text!r}") from None
    if o.choices is not None and value not in o.choices:
        raise InvalidArgumentError(
            f"argument {o.flag}: invalid choice: {value!r} (choose from "
            f"{', '.join(map(repr, o.choices))})")
    return value
