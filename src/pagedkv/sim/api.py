"""The library entry point: ``pagedkv.sim.run(workload, SimConfig) -> SimReport``.

Everything ``pagedkv simulate`` computes lives here; the CLI parses, calls and renders.

>>> from pagedkv.sim import SimConfig, run, system_prompts
>>> report = run(system_prompts(num_groups=2, questions_per_group=4),
...              SimConfig(num_blocks=2000, jobs=1))
>>> round(report.hit_rate, 4) == round(report.ideal_hit_rate, 4), report.verdict.state
(True, 'healthy')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pagedkv.checks import check_flag, check_number, check_text, check_whole
from pagedkv.errors import InvalidArgumentError
from pagedkv.planner.gpus import resolve_gpu
from pagedkv.sim.bounds import BoundResult
from pagedkv.sim.clock import (
    STEP_MODELS,
    RooflineStepModel,
    clock_summary,
    model_shape,
    typical_context,
)
from pagedkv.sim.clock.constants import load_constants
from pagedkv.sim.engine import EngineSimulator
from pagedkv.sim.host_sweep import host_simulator, with_host_tier
from pagedkv.sim.host_tier import HostMemoryConfig
from pagedkv.sim.models import (
    DEFAULT_GPU_MEMORY,
    DEFAULT_MODEL,
    CapacityPlan,
    fixed_capacity,
    plan_capacity,
)
from pagedkv.sim.parallel import bounds_in_background, sweep_rows
from pagedkv.sim.pure_cache import run_pure_cache
from pagedkv.sim.results import SimResult
from pagedkv.sim.scheduler import SchedulerConfig, StepTimeModel
from pagedkv.sim.semantics import SEMANTICS
from pagedkv.sim.summary import CapacityInfo, SimReport, build_report
from pagedkv.sim.workloads import Workload

if TYPE_CHECKING:
    from pagedkv.sim.host_engine import HostEngineSimulator
    from pagedkv.sim.observe_engine import ReplayObserver

__all__ = ["MODES", "SimConfig", "capacity_for", "run", "with_clock"]

MODES = ("engine", "pure-cache")
#: Most worker processes ``jobs`` may ask for.
MAX_JOBS = 1024
#: (done, total) progress callback, and a phase label setter.
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """What to simulate, on what capacity.

    Capacity: ``num_blocks`` of one full-attention group, or else the planner's plan for
    ``model`` (default Llama-3.1-8B) on ``gpu_memory`` (default 80GiB), every group of
    the plan simulated; ``memory_scale`` multiplies the plan's KV budget.
    ``mode``: "engine" (continuous batching, ``scheduler``) or "pure-cache".
    ``semantics``: "vllm" or "reference" (pure-cache mode; :mod:`pagedkv.sim.semantics`).
    ``bounds``: compute the infinite-cache and Belady bounds. ``capacity_sweep``:
    capacities in tokens (None = unlimited) for pure-cache LRU/Belady/infinite.
    ``jobs``: processes for sweep points and bounds (None: the CPU count).

    Raises:
        InvalidArgumentError: contradictory or out-of-range settings.
    """

    mode: str = "engine"
    semantics: str = "vllm"
    block_size: int = 16
    num_blocks: int | None = None
    model: str | None = None
    gpu_memory: str | None = None
    gpu_memory_utilization: float = 0.9
    tp: int = 1
    memory_scale: float = 1.0
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    bounds: bool = True
    warmup_fraction: float = 0.5
    capacity_sweep: tuple[int | None, ...] = ()
    jobs: int | None = None
    check_invariants: bool = False
    #: A retention policy to compare with LRU (:mod:`pagedkv.sim.retention_support`).
    retention: str | None = None
    #: A host-memory tier (engine mode; :mod:`pagedkv.sim.host_tier`); None: device only.
    host: HostMemoryConfig | None = None
    #: The GPU (:mod:`pagedkv.planner.gpus`: a name or a JSON spec path): the clock's
    #: peaks, and the memory the planner sizes the pool from unless ``gpu_memory``.
    gpu: str | None = None
    #: "auto" (the roofline clock whenever the model is known), "roofline" or "linear"
    #: (``scheduler.step_time``); :func:`pagedkv.sim.clock.with_clock`.
    step_model: str = "auto"
    #: The roofline clock's constants: a set name or a calibration file (None: default).
    calibration: str | None = None

    def __post_init__(self) -> None:
        self._check_fields()
        if self.mode not in MODES:
            raise InvalidArgumentError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.semantics not in SEMANTICS:
            raise InvalidArgumentError(
                f"semantics must be one of {tuple(SEMANTICS)}, got {self.semantics!r}")
        if self.semantics != "vllm" and self.mode == "engine":
            raise InvalidArgumentError(
                "--semantics reference is the published curves' convention for lookup-store "
                "replays: use it with --mode pure-cache (an engine stores full blocks only)")
        if self.num_blocks is not None and (self.model or self.gpu_memory or self.gpu):
            raise InvalidArgumentError("give either --num-blocks or --model/--gpu/--gpu-memory")
        if self.retention is not None:
            from pagedkv.sim.retention_support import check_policy

            check_policy(self.retention)
            if self.semantics != "vllm":
                raise InvalidArgumentError("--retention replays with --semantics vllm")
        if self.host is not None and self.mode != "engine":
            raise InvalidArgumentError("--host-memory simulates transfers in engine time: "
                                       "use it with --mode engine")
        for cap in self.capacity_sweep:
            if cap is not None and cap < self.block_size:
                raise InvalidArgumentError(
                    f"--capacity-sweep: {cap} tokens is less than one block of "
                    f"{self.block_size} tokens")

    def _check_fields(self) -> None:
        """Each field's type and range on its own (:mod:`pagedkv.checks`)."""
        for name in ("mode", "semantics", "step_model"):
            check_text(f"SimConfig.{name}", getattr(self, name))
        for name in ("model", "gpu_memory", "retention", "gpu", "calibration"):
            if getattr(self, name) is not None:
                check_text(f"SimConfig.{name}", getattr(self, name))
        check_whole("SimConfig.block_size", self.block_size, minimum=1)
        if self.num_blocks is not None:
            check_whole("SimConfig.num_blocks", self.num_blocks, minimum=2)
        check_number("--warmup-fraction", self.warmup_fraction, minimum=0, maximum=1,
                     maximum_exclusive=True)
        check_number("--gpu-memory-utilization", self.gpu_memory_utilization, minimum=0,
                     minimum_exclusive=True, maximum=1)
        check_number("SimConfig.memory_scale", self.memory_scale, minimum=0,
                     minimum_exclusive=True, maximum=1e6)
        if self.jobs is not None:
            check_whole("--jobs", self.jobs, minimum=1, maximum=MAX_JOBS)
        check_whole("--tp", self.tp, minimum=1)
        for name in ("bounds", "check_invariants"):
            check_flag(f"SimConfig.{name}", getattr(self, name))
        if not isinstance(self.scheduler, SchedulerConfig):
            raise InvalidArgumentError(
                f"SimConfig.scheduler must be a SchedulerConfig, got {self.scheduler!r}")
        if self.host is not None and not isinstance(self.host, HostMemoryConfig):
            raise InvalidArgumentError(
                f"SimConfig.host must be a HostMemoryConfig or None, got {self.host!r}")
        if not isinstance(self.capacity_sweep, tuple):
            raise InvalidArgumentError(
                f"SimConfig.capacity_sweep must be a tuple of token counts (None: "
                f"unlimited), got {self.capacity_sweep!r}")
        for cap in self.capacity_sweep:
            if cap is not None:
                check_whole("--capacity-sweep", cap, minimum=1)


def capacity_for(workload: Workload, config: SimConfig) -> CapacityPlan:
    """The capacity ``config`` asks for on ``workload`` (:mod:`pagedkv.sim.models`)."""
    if config.num_blocks is not None:
        return fixed_capacity(workload, block_size=config.block_size,
                              num_blocks=config.num_blocks)
    memory = config.gpu_memory
    if memory is None and config.gpu is not None:
        memory = resolve_gpu(config.gpu).memory
    return plan_capacity(
        workload, model=config.model or DEFAULT_MODEL,
        gpu_memory=memory or DEFAULT_GPU_MEMORY,
        utilization=config.gpu_memory_utilization, tp=config.tp,
        block_size=config.block_size, memory_scale=config.memory_scale,
        max_model_len=config.scheduler.max_model_len,
    )


def with_clock(config: SimConfig, workload: Workload) -> SimConfig:
    """``config`` with its scheduler's step time resolved: the roofline clock of
    ``config.model`` (default the planner's default model) on ``config.gpu`` with
    ``config.calibration``'s constants — unless ``step_model`` is "linear", the pool is
    a bare ``num_blocks`` (no model), or the linear model's figures were changed ("auto").
    Idempotent.

    Raises:
        InvalidArgumentError: ``step_model`` "roofline" without a model, an unknown GPU
            or constant set.
        InputFileError, ConfigError: a bad GPU spec or calibration file; a model whose
            size cannot be derived.
    """
    sched = config.scheduler
    if isinstance(sched.step_time, RooflineStepModel):
        return config
    mode = config.step_model
    if mode not in STEP_MODELS:
        raise InvalidArgumentError(f"--step-model must be one of {', '.join(STEP_MODELS)}, "
                                   f"got {mode!r}")
    if mode == "roofline" and config.num_blocks is not None:
        raise InvalidArgumentError("the roofline clock needs the model: give --model "
                                   "instead of --num-blocks, or --step-model linear")
    gpu = resolve_gpu(config.gpu)  # checks --gpu even for the linear model
    constants = load_constants(config.calibration)
    if mode == "linear" or config.num_blocks is not None or (
            mode == "auto" and sched.step_time != StepTimeModel()):
        return config
    shape = model_shape(config.model or DEFAULT_MODEL, tp=config.tp)
    clock = RooflineStepModel.build(shape, gpu, constants,
                                    typical_context_tokens=typical_context(workload))
    return replace(config, scheduler=replace(sched, step_time=clock))


def run(
    workload: Workload,
    config: SimConfig | None = None,
    *,
    description: str | None = None,
    progress: Progress | None = None,
    phase: Callable[[str], None] | None = None,
    observer: ReplayObserver | None = None,
) -> SimReport:
    """Replay ``workload`` as ``config`` says and report (hit rates beside the bounds,
    engine figures and a verdict in engine mode, the capacity sweep if asked).

    ``progress(done, total)`` and ``phase(label)`` report progress (optional).
    ``observer``: an engine replay on an observed manager instead of the plain one
    (:mod:`pagedkv.sim.observe_engine`: missed tokens by reason, Prometheus).

    Raises:
        PagedKVError: bad settings or a workload that cannot be replayed as asked.
    """
    cfg = config or SimConfig()
    say = phase or (lambda _label: None)
    if not workload.requests:
        raise InvalidArgumentError("the workload has no requests")
    if cfg.mode == "engine":
        cfg = with_clock(cfg, workload)
    cap = capacity_for(workload, cfg)
    bs = cap.block_size
    engine = cfg.mode == "engine"
    bounds_job = None
    if cfg.bounds:  # computed beside the replay (recomputed if the engine rejects some)
        bounds_job = bounds_in_background(workload, bs, cap.num_blocks - 1, indices=None,
                                          with_outputs=engine, semantics=cfg.semantics,
                                          jobs=cfg.jobs)
    say(f"replaying {len(workload.requests)} requests")
    result, host_sim = _replay(workload, cfg, cap, progress, observer)
    warmup_start = int(len(workload.requests) * cfg.warmup_fraction)
    bounds_warmup_start = warmup_start
    infinite: BoundResult | None = None
    belady: BoundResult | None = None
    if bounds_job is not None:
        say("bounds (infinite cache, Belady)")
        infinite, belady = bounds_job()
        if engine and result.rejected:  # the bounds cover the admitted requests only
            admitted = [i for i, t in enumerate(result.lookup_time_s) if t is not None]
            bounds_warmup_start = sum(1 for i in admitted if i < warmup_start)
            infinite, belady = bounds_in_background(
                workload, bs, cap.num_blocks - 1, indices=admitted, with_outputs=True,
                semantics=cfg.semantics, jobs=1)()
    sweep: tuple[Any, ...] = ()
    if cfg.capacity_sweep:
        say("capacity sweep")
        sweep = tuple(sweep_rows(workload, block_size=bs, capacities=cfg.capacity_sweep,
                                 warmup_fraction=cfg.warmup_fraction,
                                 semantics=cfg.semantics, jobs=cfg.jobs, progress=progress))
    report = build_report(
        result, description=description or workload.description, semantics=cfg.semantics,
        capacity=CapacityInfo(source=cap.source, groups=cap.group_names, note=_note(cap, cfg)),
        warmup_start=warmup_start, bounds_warmup_start=bounds_warmup_start,
        infinite=infinite, belady=belady,
        ideal_hit_rate=workload.ideal_hit_rate(bs, cfg.mode) if not cap.is_hybrid else None,
        sweep=sweep, settings=_settings(cfg),
    )
    if engine:
        report = replace(report, clock=clock_summary(cfg.scheduler.step_time, result))
    if host_sim is not None and cfg.host is not None:
        if cfg.host.sweep_memory_bytes:
            say("host memory sweep")
        report = with_host_tier(report, host_sim, workload, cap, cfg.host, _with_checks(cfg))
    if cfg.retention is not None:
        say(f"retention policy {cfg.retention} vs LRU")
        from pagedkv.sim.retention_support import compare_retention

        cmp = compare_retention(
            workload, policy=cfg.retention, block_size=bs, num_blocks=cap.num_blocks,
            warmup_fraction=cfg.warmup_fraction, with_belady=cfg.bounds,
            note="pool sized as one full-attention group" if cap.is_hybrid else None)
        report = replace(report, retention=cmp.to_dict())
    return report


def _replay(
    workload: Workload, cfg: SimConfig, cap: CapacityPlan, progress: Progress | None,
    observer: ReplayObserver | None,
) -> tuple[SimResult, HostEngineSimulator | None]:
    """The replay ``cfg`` asks for (engine, engine with a host tier, or pure-cache) and
    the host simulator (None without a host tier)."""
    bs = cap.block_size
    if cfg.mode == "engine" and cfg.host is not None:
        host_sim = host_simulator(workload, cap, cfg.host, _with_checks(cfg), observer)
        return host_sim.run(progress), host_sim
    if cfg.mode == "engine":
        factory = cap.factory if observer is None else observer.wrap(cap.factory)
        sim = EngineSimulator(workload, block_size=bs, num_blocks=cap.num_blocks,
                              config=_with_checks(cfg), manager_factory=factory)
        if observer is not None:
            observer.attach(sim)
        return sim.run(progress), None
    if observer is not None:
        raise InvalidArgumentError("missed-token attribution and metrics replay the "
                                   "engine: use them with --mode engine")
    return run_pure_cache(workload, block_size=bs, num_blocks=cap.num_blocks,
                          semantics=cfg.semantics, progress=progress,
                          check_invariants=cfg.check_invariants,
                          manager_factory=cap.factory), None


def _settings(cfg: SimConfig) -> dict[str, Any]:
    """The report's ``settings``: the semantics, and the engine's scheduler and clock."""
    settings: dict[str, Any] = {"semantics": cfg.semantics}
    if cfg.mode == "engine":
        s = cfg.scheduler
        settings.update(token_budget=s.token_budget, max_running=s.max_running,
                        arrivals=s.arrivals, rate_scale=s.rate_scale,
                        step_overhead_s=s.step_time.step_overhead_s,
                        prefill_token_s=s.step_time.prefill_token_s,
                        decode_seq_s=s.step_time.decode_seq_s,
                        clock=clock_summary(s.step_time)["clock"],
                        max_model_len=s.max_model_len)
        if s.kv_events is not None:
            settings["kv_events_endpoint"] = s.kv_events.endpoint
    return settings


def _note(cap: CapacityPlan, cfg: SimConfig) -> str | None:
    notes = [cap.note] if cap.note else []
    if cap.is_hybrid and cfg.bounds:
        notes.append("the Belady and infinite bounds treat every group as full attention "
                     "(what the prefix could give if all groups could serve it)")
    return "; ".join(notes) or None


def _with_checks(cfg: SimConfig) -> SchedulerConfig:
    s = cfg.scheduler
    if cfg.check_invariants and not s.check_invariants_every_step:
        from dataclasses import replace

        return replace(s, check_invariants_every_step=True)
    return s
