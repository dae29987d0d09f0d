"""What ``pagedkv simulate``'s option values ask for: the rules between options and the
conversion into library objects.

:func:`simulate_request` takes the values :mod:`pagedkv.sim.options` parses (a mapping
of dest -> value; a missing dest takes its default) and returns a
:class:`SimulateRequest` — the :class:`~pagedkv.sim.api.SimConfig`, the workload to load
(:class:`WorkloadSpec`), and the output, observe, replica and find-capacity settings — or
a :class:`CalibrateRequest` for ``--calibrate``. Every rule refuses with
:class:`~pagedkv.errors.InvalidArgumentError` naming the flag and the fix.

>>> req = simulate_request({"generator": "system-prompts", "groups": 2, "num_blocks": 500})
>>> req.config.num_blocks, req.workload.generator, req.workload.params
(500, 'system-prompts', {'num_groups': 2})
>>> simulate_request({"groups": 2})
Traceback (most recent call last):
...
pagedkv.errors.InvalidArgumentError: --groups is a generator parameter; add --generator
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedkv import planner
from pagedkv.arg_types import check_fields
from pagedkv.errors import InvalidArgumentError
from pagedkv.events.config import KVEventsConfig
from pagedkv.sim.api import SimConfig
from pagedkv.sim.durations import parse_seconds
from pagedkv.sim.generators import GENERATORS
from pagedkv.sim.host_tier import DEFAULT_BANDWIDTH_GBPS, HostMemoryConfig
from pagedkv.sim.loaders import load_trace
from pagedkv.sim.models import DEFAULT_MODEL
from pagedkv.sim.options import check_option_value, defaults
from pagedkv.sim.scheduler import SchedulerConfig, StepTimeModel
from pagedkv.sim.workloads import Workload, bundled_trace_path

__all__ = ["DEFAULT_SWEEP_TOKENS", "GENERATOR_PARAMS", "CalibrateRequest", "ObserveOptions",
           "OutputOptions", "ReplicaOptions", "SimulateRequest", "WorkloadSpec",
           "simulate_request", "sweep_capacities"]

DEFAULT_SWEEP_TOKENS: tuple[int | None, ...] = (
    10_000, 100_000, 1_000_000, 3_000_000, 10_000_000, None
)

#: generator name -> {option dest: generator keyword}
GENERATOR_PARAMS: dict[str, dict[str, str]] = {
    "system-prompts": {
        "groups": "num_groups", "per_group": "questions_per_group",
        "shared_tokens": "system_tokens", "message_tokens": "question_tokens",
        "output_tokens": "output_tokens", "interval_s": "interval_s",
    },
    "multi-turn": {
        "sessions": "num_conversations", "turns": "num_turns",
        "shared_tokens": "system_tokens", "message_tokens": "user_tokens",
        "output_tokens": "output_tokens", "interval_s": "interval_s", "think_s": "think_s",
    },
    "agent": {
        "sessions": "num_agents", "turns": "num_steps",
        "shared_tokens": "tool_prefix_tokens", "first_tokens": "task_tokens",
        "message_tokens": "observation_tokens", "output_tokens": "action_tokens",
        "interval_s": "interval_s", "think_s": "think_s",
    },
}
_ALL_GEN_DESTS = sorted({d for m in GENERATOR_PARAMS.values() for d in m})
_LINEAR_DESTS = ("step_overhead_ms", "prefill_token_us", "decode_seq_us")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """The workload to replay: a trace (``trace`` None: the bundled default) or a
    ``generator`` with its keyword ``params``; ``limit`` first requests."""

    trace: str | None = None
    trace_format: str = "auto"
    skip_bad_lines: bool = False
    limit: int | None = None
    trace_block_size: int = 512
    session_stagger_s: float = 0.0
    generator: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def load(self) -> tuple[Workload, str]:
        """The workload and a one-line description of it.

        Raises:
            InputFileError, InvalidArgumentError: a bad trace or generator parameter.
        """
        if self.generator is not None:
            wl = GENERATORS[self.generator](**self.params).limited(self.limit)
            return wl, f"generator {self.generator}: {wl.description}"
        path = Path(self.trace) if self.trace else bundled_trace_path()
        wl = load_trace(path, fmt=self.trace_format, skip_bad_lines=self.skip_bad_lines,
                        limit=self.limit, source_block_size=self.trace_block_size,
                        session_stagger_s=self.session_stagger_s)
        what = wl.description if self.trace else f"bundled default workload: {wl.description}"
        if wl.num_skipped_lines:
            what += (f"; {wl.num_skipped_lines} bad lines skipped (first: "
                     f"{wl.first_skipped_problem})")
        return wl, what

    def __post_init__(self) -> None:
        check_fields(self)  # types, finiteness, 64-bit and duration bounds


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputOptions:
    """How the report is rendered: JSON or tables, plots (``plot_dir`` None: none), a
    progress bar."""

    json: bool = False
    plot_dir: str | None = "pagedkv-report"
    progress: bool = True

    def __post_init__(self) -> None:
        check_fields(self)  # types, finiteness, 64-bit and duration bounds


@dataclass(frozen=True, slots=True, kw_only=True)
class ObserveOptions:
    """``--explain-misses`` / ``--metrics-port`` (:mod:`pagedkv.sim.observe_cli`)."""

    explain_misses: bool = False
    ghost_entries: int = 1_000_000
    metrics_port: int | None = None
    metrics_linger_s: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self)  # types, finiteness, 64-bit and duration bounds


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaOptions:
    """``--replicas N`` behind ``router`` ("compare": every policy)."""

    replicas: int
    router: str = "compare"

    def __post_init__(self) -> None:
        check_fields(self)  # types, finiteness, 64-bit and duration bounds


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateRequest:
    """One ``pagedkv simulate`` run: ``config`` on ``workload``; ``observe`` and
    ``replicas`` None when not asked; ``ttft_p99_target_s`` set with ``--find-capacity``."""

    config: SimConfig
    workload: WorkloadSpec
    output: OutputOptions
    observe: ObserveOptions | None = None
    replicas: ReplicaOptions | None = None
    ttft_p99_target_s: float | None = None
    tpot_p99_target_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrateRequest:
    """``--calibrate MEASURED...``: fit the roofline constants of ``model`` on ``gpu``
    (``tp``, the engine's ``token_budget`` and ``max_running``) from ``measured`` files,
    starting at ``calibration``, write ``save_to``."""

    measured: tuple[str, ...]
    save_to: str
    model: str | None = None
    gpu: str | None = None
    tp: int = 1
    calibration: str | None = None
    num_blocks: int | None = None
    json: bool = False
    token_budget: int = 8192
    max_running: int = 256


def simulate_request(values: Mapping[str, Any]) -> SimulateRequest | CalibrateRequest:
    """The run ``values`` (option dest -> parsed value) ask for (module docstring).

    Raises:
        InvalidArgumentError: an unknown option, or options that contradict each other.
    """
    v = defaults()
    unknown = sorted(set(values) - set(v) - {"func", "command", "argv"})
    if unknown:
        raise InvalidArgumentError(f"{unknown[0]!r} is not a simulate option; see "
                                   "`pagedkv simulate --help`")
    for dest, value in values.items():
        if dest not in ("func", "command", "argv"):
            check_option_value(dest, value)
    v.update(values)
    if v["limit"] is not None and v["limit"] < 1:
        raise InvalidArgumentError(f"--limit must be >= 1, got {v['limit']}")
    if v["kv_events_endpoint"] and v["mode"] != "engine":
        raise InvalidArgumentError(
            "--kv-events-endpoint publishes the events of the simulated engine: use it with "
            "--mode engine")
    if v["calibrate"]:
        return CalibrateRequest(
            measured=tuple(v["calibrate"]), save_to=v["save_calibration"], model=v["model"],
            gpu=v["gpu"], tp=v["tp"], calibration=v["calibration"],
            num_blocks=v["num_blocks"], json=v["json"], token_budget=v["token_budget"],
            max_running=v["max_running"])
    replicas = _replicas(v)
    observe = _observe(v)
    target = parse_seconds(v["ttft_p99"]) if v["find_capacity"] else None
    tpot = parse_seconds(v["tpot_p99"], "--tpot-p99") if v["find_capacity"] else None
    if v["find_capacity"] and v["mode"] != "engine":
        raise InvalidArgumentError("--find-capacity needs --mode engine (TTFT is an engine "
                                   "figure)")
    config = _config(v)
    return SimulateRequest(
        config=config, workload=_workload(v),
        output=OutputOptions(json=v["json"], plot_dir=None if v["no_plots"] else v["plot_dir"],
                             progress=not (v["no_progress"] or v["quiet"])),
        observe=observe, replicas=replicas, ttft_p99_target_s=target,
        tpot_p99_target_s=tpot)


def _replicas(v: dict[str, Any]) -> ReplicaOptions | None:
    if v["router"] is not None and v["replicas"] is None:
        raise InvalidArgumentError("--router needs --replicas N")
    if v["replicas"] is None:
        return None
    if v["mode"] != "engine":
        raise InvalidArgumentError("--replicas simulates engines: use it with --mode engine")
    for flag, bad in (("--find-capacity", v["find_capacity"]),
                      ("--capacity-sweep", bool(v["capacity_sweep"]))):
        if bad:
            raise InvalidArgumentError(f"{flag} does not apply to --replicas; drop one of them")
    return ReplicaOptions(replicas=v["replicas"], router=v["router"] or "compare")


def _observe(v: dict[str, Any]) -> ObserveOptions | None:
    port = v["metrics_port"]
    if not v["explain_misses"] and port is None:
        if v["metrics_linger_s"]:
            raise InvalidArgumentError("--metrics-linger-s goes with --metrics-port")
        return None
    flag = "--explain-misses" if v["explain_misses"] else "--metrics-port"
    if v["mode"] != "engine":
        raise InvalidArgumentError(f"{flag} observes the simulated engine: use it with "
                                   "--mode engine")
    if v["ghost_entries"] < 0:
        raise InvalidArgumentError(f"--ghost-entries must be >= 0, got {v['ghost_entries']}")
    if v["metrics_linger_s"] < 0:
        raise InvalidArgumentError(
            f"--metrics-linger-s must be >= 0, got {v['metrics_linger_s']}")
    if port is not None and not 0 <= port <= 65535:
        raise InvalidArgumentError(f"--metrics-port must be in [0, 65535], got {port}")
    return ObserveOptions(explain_misses=v["explain_misses"], ghost_entries=v["ghost_entries"],
                          metrics_port=port, metrics_linger_s=v["metrics_linger_s"])


def _workload(v: dict[str, Any]) -> WorkloadSpec:
    given = [d for d in _ALL_GEN_DESTS if v[d] is not None]
    gen = v["generator"]
    if gen is None and given:
        raise InvalidArgumentError(f"{_flag(given[0])} is a generator parameter; add "
                                   "--generator")
    if gen is not None and v["trace"] is not None:
        raise InvalidArgumentError("--trace and --generator are alternatives: give one")
    mapping = GENERATOR_PARAMS.get(gen or "", {})
    for d in given:
        if d not in mapping:
            raise InvalidArgumentError(f"{_flag(d)} does not apply to --generator {gen}")
    return WorkloadSpec(
        trace=v["trace"], trace_format=v["trace_format"], skip_bad_lines=v["skip_bad_lines"],
        limit=v["limit"], trace_block_size=v["trace_block_size"],
        session_stagger_s=v["session_stagger_s"], generator=gen,
        params={mapping[d]: v[d] for d in given})


def sweep_capacities(text: str) -> tuple[int | None, ...]:
    """``--capacity-sweep``'s capacities in tokens (None: unlimited): "default", or a
    comma-separated list of counts (``1e6``) and ``unlimited``.

    >>> sweep_capacities("1e4, unlimited")
    (10000, None)

    Raises:
        InvalidArgumentError: a part that is neither.
    """
    if text == "default":
        return DEFAULT_SWEEP_TOKENS
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("unlimited", "inf", "none"):
            out.append(None)
            continue
        try:
            out.append(int(float(part)))
        except (ValueError, OverflowError):
            raise InvalidArgumentError(
                f"--capacity-sweep: {part!r} is not a token count (e.g. 1e6) or 'unlimited'"
            ) from None
    return tuple(out)


def _linear_step_time(v: dict[str, Any]) -> StepTimeModel:
    d = StepTimeModel()
    ms, token_us, seq_us = (v[k] for k in _LINEAR_DESTS)
    return StepTimeModel(
        step_overhead_s=d.step_overhead_s if ms is None else ms / 1e3,
        prefill_token_s=d.prefill_token_s if token_us is None else token_us / 1e6,
        decode_seq_s=d.decode_seq_s if seq_us is None else seq_us / 1e6)


def _step_model(v: dict[str, Any]) -> str:
    if any(v[k] is not None for k in _LINEAR_DESTS):
        if v["step_model"] == "roofline":
            raise InvalidArgumentError("--step-overhead-ms/--prefill-token-us/--decode-seq-us "
                                       "set the linear model: drop them or --step-model "
                                       "roofline")
        return "linear"
    return str(v["step_model"] or "auto")


def _host(v: dict[str, Any]) -> HostMemoryConfig | None:
    sizes = v["host_memory"]
    if sizes is None:
        for dest in ("host_bandwidth_gbps", "host_write_policy", "no_host_baseline"):
            if v[dest] not in (None, False):
                raise InvalidArgumentError(f"{_flag(dest)} needs --host-memory")
        return None
    if v["replicas"] is not None and len(sizes) > 1:
        raise InvalidArgumentError("--replicas gives each replica one host tier: give "
                                   "--host-memory one size")
    if v["find_capacity"]:
        raise InvalidArgumentError("--find-capacity searches device memory without a host "
                                   "tier; drop --host-memory")
    return HostMemoryConfig(memory_bytes=sizes[0],
                            bandwidth_gbps=v["host_bandwidth_gbps"] or DEFAULT_BANDWIDTH_GBPS,
                            write_policy=v["host_write_policy"] or "on-eviction",
                            sweep_memory_bytes=tuple(sizes[1:]),
                            device_only_baseline=not v["no_host_baseline"])


def _context(v: dict[str, Any]) -> int | None:
    """The engine's ``max_model_len``: ``--max-model-len``, else the model's context
    (``max_position_embeddings``) when the pool is planned from a model; None without one
    (``--num-blocks``) or in pure-cache mode."""
    given: int | None = v["max_model_len"]
    if given is not None and (v["mode"] != "engine" or v["num_blocks"] is not None):
        raise InvalidArgumentError("--max-model-len sets the engine's context for --model: "
                                   "use it with --mode engine, without --num-blocks")
    if given is not None or v["mode"] != "engine" or v["num_blocks"] is not None:
        return given
    config, source, name = planner.load_config(v["model"] or DEFAULT_MODEL)
    limit: int | None = planner.model_spec_from_config(
        config, name=name, source=source).max_position_embeddings
    return limit


def _config(v: dict[str, Any]) -> SimConfig:
    step = _linear_step_time(v)
    kv_events = None
    if v["kv_events_endpoint"]:
        kv_events = KVEventsConfig(
            endpoint=v["kv_events_endpoint"], replay_endpoint=v["kv_events_replay_endpoint"],
            topic=v["kv_events_topic"], wire_form=v["kv_events_form"],
            allow_remote=v["kv_events_allow_remote"])
    sched = SchedulerConfig(
        token_budget=v["token_budget"], max_running=v["max_running"], arrivals=v["arrivals"],
        rate_scale=v["rate_scale"], step_time=step,
        check_invariants_every_step=v["check_invariants"], kv_events=kv_events,
        max_model_len=_context(v))
    sweep = sweep_capacities(v["capacity_sweep"]) if v["capacity_sweep"] else ()
    host = _host(v)
    step_model = _step_model(v)
    return SimConfig(
        mode=v["mode"], semantics=v["semantics"], block_size=v["block_size"],
        num_blocks=v["num_blocks"], model=v["model"], gpu_memory=v["gpu_memory"],
        gpu_memory_utilization=v["gpu_memory_utilization"], tp=v["tp"], scheduler=sched,
        bounds=not v["no_bounds"], warmup_fraction=v["warmup_fraction"],
        capacity_sweep=sweep,
        jobs=v["jobs"], check_invariants=v["check_invariants"], retention=v["retention"],
        host=host, gpu=v["gpu"], step_model=step_model, calibration=v["calibration"])
