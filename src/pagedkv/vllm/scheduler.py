"""vLLM's own schedulers (0.32 or 0.33) with pagedkv as their KV-cache manager.

``--scheduler-cls pagedkv.vllm.PagedKVScheduler`` (``PagedKVAsyncScheduler`` with
``--async-scheduling``), or ``SchedulerConfig(scheduler_cls=...)``. vLLM's own
constructor runs, and where it builds its ``KVCacheManager`` it gets a
:class:`~pagedkv.vllm.manager.VLLMKVCacheManager` built from the same settings instead
(vLLM's manager and block pool are never built; the KV connector and the aux-output
connector are bound to pagedkv's by vLLM's own code). Options pagedkv
does not run exactly are refused here, in one line naming the option and the fallback.

pagedkv's own features come from ``additional_config={"pagedkv": {...}}``:
``"retention": {RetentionConfig fields}`` (priorities, durations, pins; a request asks
through ``extra_args``, :mod:`pagedkv.vllm.extras`), ``"observe": {ObserveConfig
fields}`` (miss attribution, residency) and ``"metrics_port": N`` (pagedkv's Prometheus
metrics on 127.0.0.1:N). They are reached as ``scheduler.kv_cache_manager.pagedkv``
(and ``.exporter``).

The running vLLM's release is checked once, when this module is imported, and picks the
core's profile (``CacheConfig(vllm_release=...)``) and the release's constructor
arguments (:data:`pagedkv.vllm.compat.DIFFERENCES`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pagedkv.vllm.compat import require_vllm

#: The running vLLM's release series, checked once at import (``"0.32"`` or ``"0.33"``),
#: before any of vLLM's modules is imported (one line when missing or another release).
VLLM_RELEASE = require_vllm()

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from pagedkv.vllm.layout import (  # noqa: E402
    check_prefill_lookahead,
    eagle_layout_problem,
    refuse,
)
from pagedkv.vllm.manager import VLLMKVCacheManager  # noqa: E402

__all__ = ["VLLM_RELEASE", "PagedKVAsyncScheduler", "PagedKVScheduler", "install_pagedkv"]


def _feature_fields(vllm_config: Any) -> dict[str, Any]:
    """pagedkv feature configs from ``additional_config["pagedkv"]``."""
    extra = vllm_config.additional_config
    asked = extra.get("pagedkv") if isinstance(extra, dict) else None
    if not asked:
        return {}
    fields: dict[str, Any] = {}
    if "retention" in asked:
        from pagedkv.retention import RetentionConfig

        fields["retention"] = RetentionConfig(**dict(asked["retention"] or {}))
    if "observe" in asked:
        from pagedkv.observe import ObserveConfig

        fields["observe"] = ObserveConfig(**dict(asked["observe"] or {}))
    unknown = sorted(set(asked) - {"retention", "observe", "metrics_port"})
    if unknown:
        raise refuse(f"additional_config['pagedkv'] keys {unknown} "
                     "(known: metrics_port, observe, retention)")
    return fields


def _start_exporter(vllm_config: Any, mgr: VLLMKVCacheManager) -> None:
    """``additional_config["pagedkv"]["metrics_port"]``: serve pagedkv's Prometheus
    metrics on 127.0.0.1 (0: any free port), recorded at each of vLLM's stats intervals."""
    extra = vllm_config.additional_config
    asked = extra.get("pagedkv") if isinstance(extra, dict) else None
    if not asked or asked.get("metrics_port") is None:
        return
    from pagedkv.observe.prometheus import PrometheusExporter

    exporter = PrometheusExporter()
    mgr.metrics_port = exporter.serve(int(asked["metrics_port"]))
    mgr.exporter = exporter


def _check_options(s: Any) -> None:
    """Refuse the scheduler options pagedkv does not run exactly (reads only what vLLM's
    constructor has set on ``s`` before it builds its KV-cache manager)."""
    if s.dcp_world_size > 1 or s.pcp_world_size > 1:
        raise refuse("decode/prefill context parallelism (dcp/pcp world size > 1)")
    if s.use_eagle_block_drop and s.cache_config.enable_prefix_caching:
        problem = eagle_layout_problem(s.kv_cache_config.kv_cache_groups)
        if problem is not None:
            raise refuse(f"the EAGLE last-block drop on {problem}")
    if s.cache_config.enable_mamba_shared_prefix_checkpoint:
        raise refuse("enable_mamba_shared_prefix_checkpoint")
    _check_retention_interval(s)


def _check_retention_interval(s: Any) -> None:
    """vLLM's sparse prefix-cache retention (``prefix_cache_retention_interval``, 0 by
    default in ``CacheConfig``; the planner copies it into the ``KVCacheConfig``) keeps a
    sliding-window or Mamba group's blocks cached only at chosen boundaries; pagedkv keeps
    them densely (``None``), so it refuses the sparse setting on such a model."""
    interval = getattr(s.kv_cache_config, "prefix_cache_retention_interval", None)
    if interval is None or not s.cache_config.enable_prefix_caching:
        return
    kinds = {type(g.kv_cache_spec).__name__ for g in s.kv_cache_config.kv_cache_groups
             if getattr(g.kv_cache_spec, "prefix_cacheable", True)}  # replayed SWA: never cached
    sparse = sorted(k for k in kinds if "SlidingWindow" in k or "Mamba" in k)
    if sparse:
        raise refuse(f"sparse prefix-cache retention (prefix_cache_retention_interval="
                     f"{interval}) on {', '.join(sparse)} groups: start vLLM with "
                     "--prefix-cache-retention-interval None (dense retention, which "
                     "pagedkv runs exactly)")


def _build_manager(s: Any) -> VLLMKVCacheManager:
    """pagedkv's manager with scheduler ``s``'s settings (read from ``s`` as vLLM's
    constructor has set them before it builds its manager)."""
    cfg = s.vllm_config
    fields: dict[str, Any] = dict(
        hash_block_size=s.hash_block_size,
        max_in_flight_tokens=cfg.max_in_flight_tokens,
        drop_last_hit=bool(s.use_eagle_block_drop),
        vllm_release=VLLM_RELEASE,
        num_prefill_lookahead_tokens=int(s.num_prefill_lookahead or 0),
    )
    check_prefill_lookahead(s.kv_cache_config, int(s.block_size),
                            fields["num_prefill_lookahead_tokens"],
                            eagle_drop=bool(s.use_eagle_block_drop),
                            enable_caching=bool(s.cache_config.enable_prefix_caching))
    if VLLM_RELEASE != "0.32":
        fields["num_hash_lookahead_tokens"] = s.num_hash_lookahead_tokens
    if s.hash_block_size == s.block_size:
        del fields["hash_block_size"]
    fields.update(_feature_fields(cfg))
    mgr = VLLMKVCacheManager(
        s.kv_cache_config, s.max_model_len,
        enable_caching=bool(s.cache_config.enable_prefix_caching), log_stats=s.log_stats,
        enable_kv_cache_events=s.enable_kv_cache_events,
        watermark=s.scheduler_config.watermark,
        max_encoder_len=int(s.scheduler_config.max_num_encoder_input_tokens or 0),
        cache_fields=fields)
    return mgr


@contextmanager
def _pagedkv_built_in_place(s: Any) -> Iterator[None]:
    """While vLLM's ``Scheduler.__init__`` runs on ``s``: the name it builds its
    KV-cache manager by (``KVCacheManager`` in vLLM's scheduler module) builds pagedkv's
    manager for ``s`` instead, so vLLM's manager and block pool are never built and what
    vLLM's constructor does next (binding the connector, building the aux-output
    connector) gets pagedkv's. One construction at a time (a lock); restored after; a
    manager asked for with another ``kv_cache_config`` meanwhile is vLLM's own."""
    import vllm.v1.core.sched.scheduler as vllm_scheduler

    def build(*args: Any, **vllm_arguments: Any) -> Any:
        if vllm_arguments.get("kv_cache_config") is not getattr(s, "kv_cache_config", s):
            # Another scheduler's construction (another thread): vLLM's own manager.
            return stock(*args, **vllm_arguments)
        # vLLM's own arguments are those _build_manager reads from s.
        _check_options(s)
        return _build_manager(s)

    with _BUILD_LOCK:
        stock = vllm_scheduler.KVCacheManager
        vllm_scheduler.KVCacheManager = build
        try:
            yield
        finally:
            vllm_scheduler.KVCacheManager = stock


_BUILD_LOCK = threading.RLock()  # reentrant: a class deriving from both schedulers nests


def install_pagedkv(s: Any) -> VLLMKVCacheManager:
    """Make pagedkv's manager scheduler ``s``'s KV-cache manager (same settings) after
    vLLM's constructor: checks the options, then builds it (unless the constructor
    already did, :func:`_pagedkv_built_in_place`) and binds the connectors to it.
    Called by the scheduler classes below.

    Raises:
        UnsupportedLayoutError: a layout or option pagedkv does not run exactly.
    """
    cfg = s.vllm_config
    built_in_place = isinstance(s.kv_cache_manager, VLLMKVCacheManager)
    if built_in_place:
        mgr: VLLMKVCacheManager = s.kv_cache_manager
    else:
        _check_options(s)
        mgr = _build_manager(s)
        s.kv_cache_manager = mgr
    _start_exporter(cfg, mgr)
    if s.connector is not None and not built_in_place:
        s.connector.bind_kv_cache_manager(mgr)
    if (s.aux_output_connector is not None and VLLM_RELEASE != "0.32"
            and not built_in_place):
        # 0.33 builds it over the manager (0.32's takes no arguments: kept as built).
        from vllm.distributed.aux_output_connector.connector import (
            AuxOutputSchedulerConnector,
        )

        s.aux_output_connector = AuxOutputSchedulerConnector(mgr, s.connector)
    s.mamba_partial_cache_hit = (s.need_mamba_block_aligned_split
                                 and s.hash_block_size < s.block_size
                                 and mgr.coordinator.enable_partial_hash_hits)
    s.mamba_shared_prefix_checkpoint = False
    return mgr


class PagedKVScheduler(Scheduler):  # type: ignore[misc]
    """vLLM's ``Scheduler`` with pagedkv as its KV-cache manager (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with _pagedkv_built_in_place(self):
            super().__init__(*args, **kwargs)
        install_pagedkv(self)


class PagedKVAsyncScheduler(AsyncScheduler):  # type: ignore[misc]
    """vLLM's ``AsyncScheduler`` with pagedkv as its KV-cache manager."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with _pagedkv_built_in_place(self):
            super().__init__(*args, **kwargs)
        install_pagedkv(self)
