"""The vLLM releases this package runs against (0.32 and 0.33), checked once per entry
point (the class names via ``pagedkv.vllm``, the plugin, and each submodule that imports
vLLM, before it does), one line when missing; the table of what differs between them;
and the table of every vLLM member the adapter reads or writes (:data:`REACHES`).

Every difference in the files pagedkv mirrors (vLLM's ``v1/core``) is one row of
:data:`DIFFERENCES`: the vLLM member or behaviour, what 0.32 does, what 0.33 does, and how
pagedkv follows it (a ``CacheConfig.vllm_release`` profile decided at construction, a
branch in the adapter, or why the difference cannot show).
"""

from __future__ import annotations

from typing import NamedTuple

from pagedkv.errors import MissingDependencyError

__all__ = ["DIFFERENCES", "REACHES", "SUPPORTED_VLLM", "Difference", "Reach",
           "differences_table", "reaches_table", "release_of", "require_vllm"]

#: The vLLM release series the scheduler classes are written and tested against, oldest
#: first; the newest is ``CacheConfig.vllm_release``'s default.
SUPPORTED_VLLM = ("0.32", "0.33")


class Difference(NamedTuple):
    """One vLLM member or behaviour that differs between 0.32 and 0.33."""

    where: str
    in_032: str
    in_033: str
    pagedkv: str


_PROFILE = "CacheConfig(vllm_release=...)"

#: vLLM 0.32 -> 0.33 in the files pagedkv mirrors, one row each (docs/vllm.md prints it).
DIFFERENCES: tuple[Difference, ...] = (
    Difference("KVCacheManager(num_hash_lookahead_tokens=)", "no such argument",
               "tokens after each block its hash covers",
               f"{_PROFILE}: 0.32 refuses num_hash_lookahead_tokens > 0; the adapter "
               "passes the scheduler's value under 0.33 only"),
    Difference("KVCacheManager.get_computed_blocks(request, max_cache_hit_length=)",
               "no second argument (limit num_tokens - 1)", "optional upper bound",
               "the adapter takes the argument as optional: one signature serves both"),
    Difference("get_computed_blocks_for_connector(..., max_cache_hit_length=)",
               "no second argument", "optional upper bound", "as above"),
    Difference("BlockPool: lookahead tokens in block hashes and stored events",
               "absent", "hashes and BlockStored events cover L more tokens",
               f"{_PROFILE}: lookahead is 0.33 only"),
    Difference("BlockPool.touch / free_blocks on the null block",
               "the null block's ref_cnt counted up and down", "skipped",
               "not observable: the null block never enters the free queue in either"),
    Difference("SingleTypeKVCacheManager.pop_blocks_for_free (and the Mamba override)",
               "the table with its leading null blocks", "leading null blocks trimmed",
               f"{_PROFILE}: pop_blocks_for_free keeps them under 0.32 (release skips them)"),
    Difference("cache_blocks: registered blocks capped at the request's hashed tokens",
               "num_tokens // block_size", "min(num_tokens, hashed tokens) // block_size",
               "equal without lookahead (every full block is hashed), so equal under 0.32"),
    Difference("sparse SWA retention: EAGLE junction boundary (shared_prefix_boundary - bs)",
               "absent", "an extra reachable boundary", "no branch in pagedkv: it needs "
               "EAGLE on a Mamba junction under sparse retention, which neither the "
               "transcripts nor the engine test run (not verified)"),
    Difference("MambaManager: assert mamba_cache_mode == 'align' with caching", "absent",
               "assertion", "pagedkv refuses any other mode under both releases"),
    Difference("Mamba cache_partial_block of a block already keyed at that length",
               "keyed again", "skipped", "CacheConfig(vllm_release=...): the 0.32 "
               "profile keys a Mamba prompt-tail state again (registered in that step); "
               "both releases' full+mamba/ext transcripts replay equal"),
    Difference("KVCacheCoordinator.drop_eagle_group_ids", "eagle_group_ids",
               "eagle_group_ids, or none with lookahead hashes",
               "equal without lookahead, so equal under 0.32"),
    Difference("Scheduler.aux_output_connector", "AuxOutputSchedulerConnector() (holds no manager)",
               "AuxOutputSchedulerConnector(kv_cache_manager, connector)",
               "the adapter rebuilds it over its manager under 0.33, keeps 0.32's"),
    Difference("Scheduler.num_hash_lookahead_tokens", "no such attribute", "int",
               "read under 0.33 only"),
)


def differences_table() -> str:
    """:data:`DIFFERENCES` as the Markdown table docs/vllm.md prints (a test checks it)."""
    rows = ["| vLLM member or behaviour | 0.32 | 0.33 | pagedkv |", "| --- | --- | --- | --- |"]
    rows += [f"| `{d.where}` | {d.in_032} | {d.in_033} | {d.pagedkv} |" for d in DIFFERENCES]
    return "\n".join(rows)


class Reach(NamedTuple):
    """One vLLM member the adapter (``pagedkv.vllm``) reads, writes, calls or subclasses:
    where 0.33 defines it (``file`` under ``vllm/``, 1-based ``line_033``) and 0.32's line
    (``line_032``: 0 when the same, -1 when 0.32 has no such member)."""

    member: str
    file: str
    line_033: int
    line_032: int
    use: str


#: Every vLLM member the adapter reaches (a test checks each exists in the installed
#: vLLM at the line named, and that the adapter's sources reach no other).
REACHES: tuple[Reach, ...] = (
    Reach("Scheduler.vllm_config", "v1/core/sched/scheduler.py", 98, 96, "read: config sections"),
    Reach("Scheduler.scheduler_config", "v1/core/sched/scheduler.py", 99, 97,
          "read: watermark, encoder budget"),
    Reach("Scheduler.cache_config", "v1/core/sched/scheduler.py", 100, 98,
          "read: prefix caching, Mamba checkpoint option"),
    Reach("Scheduler.kv_cache_config", "v1/core/sched/scheduler.py", 103, 101, "read: the layout"),
    Reach("Scheduler.connector", "v1/core/sched/scheduler.py", 166, 164,
          "read: refusals; bind_kv_cache_manager"),
    Reach("Scheduler.aux_output_connector", "v1/core/sched/scheduler.py", 482, 423,
          "read/write: rebuilt over pagedkv (0.33)"),
    Reach("Scheduler.block_size", "v1/core/sched/scheduler.py", 218, 209, "read"),
    Reach("Scheduler.hash_block_size", "v1/core/sched/scheduler.py", 350, 327, "read"),
    Reach("Scheduler.max_model_len", "v1/core/sched/scheduler.py", 147, 145, "read"),
    Reach("Scheduler.log_stats", "v1/core/sched/scheduler.py", 106, 104, "read"),
    Reach("Scheduler.enable_kv_cache_events", "v1/core/sched/scheduler.py", 148, 146, "read"),
    Reach("Scheduler.dcp_world_size", "v1/core/sched/scheduler.py", 219, 210, "read: refusal"),
    Reach("Scheduler.pcp_world_size", "v1/core/sched/scheduler.py", 220, 211, "read: refusal"),
    Reach("Scheduler.num_prefill_lookahead", "v1/core/sched/scheduler.py", 315, 306,
          "read: refusal"),
    Reach("Scheduler.num_hash_lookahead_tokens", "v1/core/sched/scheduler.py", 342, -1,
          "read (0.33)"),
    Reach("Scheduler.use_eagle_block_drop", "v1/core/sched/scheduler.py", 296, 287, "read"),
    Reach("Scheduler.need_mamba_block_aligned_split", "v1/core/sched/scheduler.py", 432, 377,
          "read"),
    Reach("Scheduler.mamba_partial_cache_hit", "v1/core/sched/scheduler.py", 452, 397,
          "write: pagedkv's partial-hit setting"),
    Reach("Scheduler.mamba_shared_prefix_checkpoint", "v1/core/sched/scheduler.py", 461, 406,
          "write: False (refused option)"),
    Reach("Scheduler.kv_cache_manager", "v1/core/sched/scheduler.py", 351, 328,
          "read/write: pagedkv's manager"),
    Reach("scheduler.KVCacheManager", "v1/core/sched/scheduler.py", 40, 38,
          "write while Scheduler.__init__ runs: builds pagedkv's"),
    Reach("Scheduler", "v1/core/sched/scheduler.py", 86, 84, "subclassed"),
    Reach("AsyncScheduler", "v1/core/sched/async_scheduler.py", 13, 14, "subclassed"),
    Reach("SchedulerConfig.get_scheduler_cls", "config/scheduler.py", 231, 228,
          "write (plugin, PAGEDKV_VLLM=1)"),
    Reach("SchedulerConfig.watermark", "config/scheduler.py", 196, 0, "read"),
    Reach("SchedulerConfig.max_num_encoder_input_tokens", "config/scheduler.py", 146, 0, "read"),
    Reach("VllmConfig.additional_config", "config/vllm.py", 429, 421, "read: pagedkv's options"),
    Reach("VllmConfig.max_in_flight_tokens", "config/vllm.py", 601, 590, "read"),
    Reach("CacheConfig.enable_prefix_caching", "config/cache.py", 257, 141, "read"),
    Reach("CacheConfig.enable_mamba_shared_prefix_checkpoint", "config/cache.py", 312, 197,
          "read: refusal"),
    Reach("KVCacheConfig.kv_cache_groups", "v1/kv_cache_interface.py", 1533, 1467, "read"),
    Reach("KVCacheConfig.num_blocks", "v1/kv_cache_interface.py", 1529, 1463,
          "read: watermark blocks"),
    Reach("KVCacheConfig.has_mamba_layers", "v1/kv_cache_interface.py", 1630, 1564,
          "read: refusal"),
    Reach("KVCacheConfig.prefix_cache_retention_interval", "v1/kv_cache_interface.py", 1541, 1475,
          "read (getattr): refusal"),
    Reach("KVCacheGroupSpec.kv_cache_spec", "v1/kv_cache_interface.py", 1513, 1447, "read"),
    Reach("KVCacheSpec.block_size", "v1/kv_cache_interface.py", 206, 169, "read"),
    Reach("KVConnectorBase_V1.bind_kv_cache_manager",
          "distributed/kv_transfer/kv_connector/v1/base.py", 490, 475,
          "called (manager built after the connector)"),
    Reach("KVConnectorBase_V1.supports_divergent_local_hybrid_hits",
          "distributed/kv_transfer/kv_connector/v1/base.py", 189, 188,
          "read (getattr): refusal"),
    Reach("AuxOutputSchedulerConnector", "distributed/aux_output_connector/connector.py", 54, 44,
          "built over pagedkv's manager (0.33)"),
    Reach("Request.request_id", "v1/request.py", 84, 0, "read"),
    Reach("Request.num_computed_tokens", "v1/request.py", 184, 0, "read"),
    Reach("Request.num_tokens", "v1/request.py", 295, 0, "read"),
    Reach("Request.block_hashes", "v1/request.py", 225, 0, "read"),
    Reach("Request.num_in_flight_tokens", "v1/request.py", 173, 0, "read: async in-flight tokens"),
    Reach("Request.status", "v1/request.py", 100, 0, "read: admitting or running"),
    Reach("Request.num_preemptions", "v1/request.py", 216, 0, "read"),
    Reach("Request.num_prompt_tokens", "v1/request.py", 143, 0, "read"),
    Reach("Request.all_token_ids", "v1/request.py", 194, 0, "read"),
    Reach("Request.skip_reading_prefix_cache", "v1/request.py", 232, 0, "read"),
    Reach("Request.sampling_params", "v1/request.py", 87, 0, "read (getattr): extra_args"),
    Reach("Request.lora_request", "v1/request.py", 89, 0, "read (getattr): hash extras"),
    Reach("Request.mm_features", "v1/request.py", 188, 0, "read (getattr): hash extras"),
    Reach("Request.prompt_embeds", "v1/request.py", 135, 0, "read (getattr): hash extras"),
    Reach("Request.cache_salt", "v1/request.py", 185, 0, "read (getattr): hash extras"),
    Reach("Request.session_id", "v1/request.py", 197, 0, "read (getattr): event sessions"),
    Reach("Request.kv_cache_report_mode", "v1/request.py", 126, 0, "read (getattr): warning"),
    Reach("RequestStatus", "v1/request.py", 370, 0, "WAITING, PREEMPTED"),
    Reach("KVCacheBlocks", "v1/core/kv_cache_manager.py", 35, 0, "subclassed (PagedKVBlocks)"),
    Reach("KVCacheBlockCopy", "v1/core/kv_cache_utils.py", 253, 241, "built"),
    Reach("make_block_hash_with_group_id", "v1/core/kv_cache_utils.py", 60, 74,
          "called: vLLM's key"),
    Reach("PrefixCacheStats", "v1/metrics/stats.py", 121, 0, "built, record()"),
    Reach("FullAttentionSpec", "v1/kv_cache_interface.py", 619, 578,
          "isinstance: the first full-attention group (the coordinator view's)"),
    Reach("kv_cache_coordinator.KVCacheCoordinatorNoPrefixCache",
          "v1/core/kv_cache_coordinator.py", 480, 476,
          "a base of the coordinator view (isinstance), constructor never run"),
    Reach("kv_cache_coordinator.UnitaryKVCacheCoordinator",
          "v1/core/kv_cache_coordinator.py", 530, 524,
          "a base of the coordinator view (isinstance), constructor never run"),
    Reach("kv_cache_coordinator.HybridKVCacheCoordinator",
          "v1/core/kv_cache_coordinator.py", 617, 609,
          "a base of the coordinator view (isinstance), constructor never run"),
    Reach("single_type_kv_cache_manager.FullAttentionManager",
          "v1/core/single_type_kv_cache_manager.py", 739, 729,
          "a base of the group view (isinstance), constructor never run"),
    Reach("single_type_kv_cache_manager.SinkFullAttentionManager",
          "v1/core/single_type_kv_cache_manager.py", 2199, 2176,
          "a base of the group view (isinstance), constructor never run"),
    Reach("single_type_kv_cache_manager.SlidingWindowManager",
          "v1/core/single_type_kv_cache_manager.py", 946, 933,
          "a base of the group view (isinstance), constructor never run"),
    Reach("single_type_kv_cache_manager.ChunkedLocalAttentionManager",
          "v1/core/single_type_kv_cache_manager.py", 1276, 1263,
          "a base of the group view (isinstance), constructor never run"),
    Reach("single_type_kv_cache_manager.MambaManager",
          "v1/core/single_type_kv_cache_manager.py", 1428, 1415,
          "a base of the group view (isinstance), constructor never run"),
    Reach("single_type_kv_cache_manager.CrossAttentionManager",
          "v1/core/single_type_kv_cache_manager.py", 2138, 2115,
          "a base of the group view (isinstance), constructor never run"),
    Reach("kv_events.BlockStored", "distributed/kv_events.py", 56, 0, "built (events)"),
    Reach("kv_events.BlockRemoved", "distributed/kv_events.py", 123, 116, "built (events)"),
    Reach("kv_events.AllBlocksCleared", "distributed/kv_events.py", 144, 137,
          "built (events)"),
    Reach("maybe_convert_block_hash", "v1/core/kv_cache_utils.py", 82, 96,
          "called: events' block hashes"),
    Reach("get_kv_cache_spec_kind", "v1/kv_cache_interface.py", 1421, 1355,
          "called: events' group kind"),
    Reach("get_kv_cache_spec_sliding_window", "v1/kv_cache_interface.py", 1462, 1396,
          "called: events' window"),
)


def reaches_table() -> str:
    """:data:`REACHES` as the Markdown table docs/vllm.md prints (a test checks it)."""
    rows = ["| vLLM member | file (vllm/) | 0.33 line | 0.32 line | adapter's use |",
            "| --- | --- | ---: | ---: | --- |"]
    for r in REACHES:
        old = "same" if r.line_032 == 0 else "absent" if r.line_032 < 0 else str(r.line_032)
        rows.append(f"| `{r.member}` | {r.file} | {r.line_033} | {old} | {r.use} |")
    return "\n".join(rows)


def release_of(version: str) -> str | None:
    """The supported series ``version`` belongs to (``"0.32.0"`` -> ``"0.32"``), else None."""
    for series in SUPPORTED_VLLM:
        if version.startswith(series + "."):
            return series
    return None


_checked: dict[str, str] = {}


def require_vllm() -> str:
    """The series (``"0.32"`` or ``"0.33"``) of the importable vLLM when it is supported
    (checked once per installed version string; every entry point calls it).

    Raises:
        MissingDependencyError: vLLM is not installed, or another release (one line
            naming the fix).
    """
    from pagedkv.doctor import install_command

    try:
        import vllm
    except ImportError as e:
        raise MissingDependencyError(
            f"pagedkv.vllm needs vLLM {' or '.join(SUPPORTED_VLLM)} "
            f"({install_command('vllm')}): {e}"
        ) from None
    version = str(getattr(vllm, "__version__", ""))
    known = _checked.get(version)
    if known is not None:
        return known
    series = release_of(version)
    if series is None:
        wanted = " or ".join(s + ".*" for s in SUPPORTED_VLLM)
        raise MissingDependencyError(
            f"pagedkv.vllm supports vLLM {wanted}, found {version or 'unknown'}; "
            f"install a supported one ({install_command('vllm')}) or run without "
            "--scheduler-cls")
    _checked[version] = series
    return series
