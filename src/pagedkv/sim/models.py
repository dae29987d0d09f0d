"""The capacity a simulation runs on: a model on a GPU through the planner, with every
KV-cache group of the plan simulated by its real manager (sliding window, chunked local,
Mamba, full), at the planner's block sizes and ``num_blocks`` — or a bare ``num_blocks``
of one full-attention group.

A hybrid model's hit rate is not a full-attention model's: a sliding-window group needs
only the last window of a hit cached but stores every block, all groups share one pool,
and the hit is the longest prefix every group can serve. Simulating one full-attention
group holding the plan's tokens hides that, so the groups are simulated as planned.

Memory: "80GiB" is what an "80 GB" H100 has (80 × 2³⁰ bytes); the default GPU is written
so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pagedkv import CacheConfig, KVCacheManager, KVCacheSpec, planner
from pagedkv.errors import ConfigError, InvalidArgumentError
from pagedkv.events.config import KVEventsConfig
from pagedkv.planner import KVCachePlan
from pagedkv.sim.scheduler import ManagerFactory, build_manager, workload_max_len
from pagedkv.sim.workloads import Workload, check_block_size

__all__ = [
    "DEFAULT_GPU_MEMORY",
    "DEFAULT_MODEL",
    "CapacityPlan",
    "fixed_capacity",
    "plan_capacity",
    "plan_factory",
]

DEFAULT_MODEL = "Llama-3.1-8B"
#: An "80 GB" H100 has 80 GiB.
DEFAULT_GPU_MEMORY = "80GiB"
#: The most blocks a simulated pool may have (about 100 bytes of host memory each).
MAX_SIM_BLOCKS = 20_000_000
#: Activation memory the planner's budget keeps free.
ACTIVATION_RESERVE = "2GiB"


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityPlan:
    """What a run is sized to: ``num_blocks`` (the null block included) of the
    ``groups``' layer specs; ``block_size`` is the block size request hashes use (the
    smallest group block size); ``source`` says where it came from; ``note`` anything a
    reader should know (a capped pool, ...). ``factory`` builds the manager."""

    num_blocks: int
    block_size: int
    groups: tuple[KVCacheSpec, ...]
    source: str
    note: str | None = None
    plan_kv_tokens: int | None = None
    #: Bytes one block id holds on the device (one page per KV-cache tensor); None when
    #: no model sized the pool.
    block_bytes: int | None = None
    factory: ManagerFactory = field(default=build_manager, repr=False, compare=False)

    @property
    def group_names(self) -> tuple[str, ...]:
        """One short description per group (kind, block size, window)."""
        return tuple(_describe(g) for g in self.groups)

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1 or type(self.groups[0]).__name__ != "FullAttentionSpec"

    @property
    def capacity_tokens(self) -> int:
        """Token slots of the pool if one group held them all (``(num_blocks-1) * b``)."""
        return (self.num_blocks - 1) * self.block_size


def _describe(spec: KVCacheSpec) -> str:
    text = f"{spec.kind} (block {spec.block_size}"
    for attr in ("sliding_window", "attention_chunk_size"):
        value = getattr(spec, attr, None)
        if value:
            text += f", {attr.replace('_', ' ')} {value}"
    return text + ")"


def plan_factory(plan: KVCachePlan) -> ManagerFactory:
    """A manager factory for every group of ``plan`` (``CacheConfig.from_plan``), with
    ``max_model_len`` fitted to the workload and the pool size the simulation asks for."""

    def factory(
        workload: Workload, *, block_size: int, num_blocks: int,
        kv_events: KVEventsConfig | None = None,
    ) -> KVCacheManager:
        check_block_size(block_size, workload.source_block_size)
        if num_blocks < 2:
            raise InvalidArgumentError(
                f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        config = CacheConfig.from_plan(
            plan, max_model_len=workload_max_len(workload, block_size), kv_events=kv_events)
        if num_blocks != config.num_blocks:
            config = replace(config, num_blocks=num_blocks)
        return KVCacheManager(config)

    return factory


def fixed_capacity(workload: Workload, *, block_size: int, num_blocks: int) -> CapacityPlan:
    """``num_blocks`` of one full-attention group. A pool larger than the whole workload
    could ever fill (every block of every request at once) is capped to that size — more
    blocks change nothing — and the note says so.

    Raises:
        InvalidArgumentError: fewer than 2 blocks, or a block size the workload's hashes
            cannot be replayed at.
    """
    from pagedkv import FullAttentionSpec

    check_block_size(block_size, workload.source_block_size)
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
        raise InvalidArgumentError(
            f"--num-blocks must be an integer >= 2 (block 0 is the null block), got "
            f"{num_blocks!r}")
    note = None
    enough = sum(
        -(-(r.num_prompt_tokens + max(1, r.num_output_tokens)) // block_size) + 1
        for r in workload.requests
    ) + 2
    if num_blocks > enough:
        note = (f"--num-blocks {num_blocks:,} capped to {enough:,}: the whole workload fits "
                "at once, more blocks change nothing")
        num_blocks = enough
    if num_blocks > MAX_SIM_BLOCKS:
        raise InvalidArgumentError(
            f"--num-blocks {num_blocks:,}: the simulator holds about 100 bytes per block "
            f"(~{num_blocks * 100 / 1e9:.1f} GB); give at most {MAX_SIM_BLOCKS:,}")
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128,
                             dtype_bytes=2)
    return CapacityPlan(num_blocks=num_blocks, block_size=block_size, groups=(spec,),
                        source="--num-blocks", note=note)


def plan_capacity(
    workload: Workload,
    *,
    model: str = DEFAULT_MODEL,
    gpu_memory: str = DEFAULT_GPU_MEMORY,
    utilization: float = 0.9,
    tp: int = 1,
    block_size: int = 16,
    memory_scale: float = 1.0,
    max_model_len: int | None = None,
) -> CapacityPlan:
    """The planner's capacity for ``model`` (bundled name or config.json) on one GPU of
    ``gpu_memory`` (``memory_scale`` multiplies the KV-cache budget: a capacity search).
    Every group of the plan is simulated by its own manager. The plan's
    ``max_model_len`` is the workload's longest request, at most ``max_model_len``.

    Raises:
        InputFileError, ConfigError, InvalidArgumentError: from the planner.
    """
    check_block_size(block_size, workload.source_block_size)
    config, source, name = planner.load_config(model)
    spec = planner.model_spec_from_config(config, name=name, source=source, tp_size=tp,
                                          block_size=block_size)
    weights = planner.estimate_weights(config, source=source, tp_size=tp)
    budget = planner.kv_cache_budget(
        gpu_memory_bytes=planner.parse_bytes(gpu_memory, what="--gpu-memory"),
        utilization=utilization,
        weight_bytes=weights.weight_bytes_per_rank,
        activation_reserve_bytes=planner.parse_bytes(ACTIVATION_RESERVE, what="reserve"),
    )
    if budget.kv_cache_bytes <= 0:
        fits = next((n for n in (2, 4, 8, 16) if n > tp and planner.estimate_weights(
            config, source=source, tp_size=n).weight_bytes_per_rank
            < budget.kv_cache_bytes + weights.weight_bytes_per_rank), None)
        raise ConfigError(
            f"{spec.name}: the weights ({planner.format_bytes(weights.weight_bytes_per_rank)} "
            f"per GPU at TP {tp}) do not fit on one GPU of {gpu_memory}: use "
            f"--tp {fits or 'N'} or a larger GPU (--gpu, --gpu-memory)")
    available = int(budget.kv_cache_bytes * memory_scale)
    longest = workload_max_len(workload, block_size)
    plan = planner.plan_kv_cache(
        spec.layer_to_spec, available_bytes=available, model_name=spec.name,
        max_model_len=longest if max_model_len is None else min(longest, max_model_len),
    )
    groups = tuple(g.spec for g in plan.groups)
    hash_bs = min(g.block_size for g in groups)
    src = workload.source_block_size
    if src is not None and src % hash_bs and hash_bs % src:
        fit = next((d for d in range(hash_bs, src + 1) if src % d == 0),
                   -(-hash_bs // src) * src)
        raise InvalidArgumentError(
            f"{spec.name}'s plan uses {hash_bs}-token blocks (the planner's block size for "
            f"--block-size {block_size}; hybrid state pages can force it) and cannot replay "
            f"a trace of {src}-token hash blocks; use --block-size {fit}, or a generator")
    scale = "" if memory_scale == 1.0 else f", KV memory x{memory_scale:g}"
    where = (f"planner: {spec.name} on {gpu_memory} (utilization {utilization:g}, TP {tp}"
           f"{scale}): {len(groups)} KV-cache group{'s' if len(groups) > 1 else ''}")
    factory = build_manager if len(groups) == 1 and hash_bs == block_size and \
        type(groups[0]).__name__ == "FullAttentionSpec" else plan_factory(plan)
    return CapacityPlan(num_blocks=plan.num_blocks, block_size=hash_bs, groups=groups,
                        source=where, plan_kv_tokens=plan.kv_tokens,
                        block_bytes=(plan.page_size_bytes or 0) * len(plan.tensors),
                        factory=factory)
