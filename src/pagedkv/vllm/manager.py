"""vLLM 0.33's ``KVCacheManager`` surface over pagedkv's façade
(:class:`VLLMKVCacheManager`): the members vLLM's scheduler, KV connectors and engine
core use, each a call to a public façade method. Built by
:class:`~pagedkv.vllm.scheduler.PagedKVScheduler`; a user never builds one.

Translation, call by call (vLLM name -> pagedkv):

* ``get_computed_blocks(req, max)`` -> ``lookup_prefix(view, max, record_stats=False)``
  (vLLM counts a lookup when the request is admitted: ``record_prefix_cache_stats`` ->
  ``record_lookup``);
* ``allocate_slots(...)`` -> ``allocate_slots(..., num_in_flight_tokens=
  req.num_in_flight_tokens, lenient_counts=True)`` (windows freed on processed tokens;
  draft tokens and output placeholders past the request's tokens); the steady-state
  decode call (a live request, no hit, lookahead, external or encoder tokens, no delayed
  caching or reserve) goes as ``allocate_slots(view, n, num_in_flight_tokens=k,
  lenient_counts=True)`` and nothing else, which the compiled core's decode path takes
  (sync and async scheduling alike);
* ``free`` / ``pop_blocks_for_free`` / ``block_pool.free_blocks`` -> ``free`` /
  ``pop_blocks_for_free`` / ``release_blocks``;
* ``take_events`` -> the façade's records as vLLM events, each stored batch stamped with
  the session of the request that stored it.
"""

from __future__ import annotations

import logging
from typing import Any

from pagedkv.vllm.compat import require_vllm

require_vllm()  # before vLLM's modules: one line when vLLM is missing or another release

from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy  # noqa: E402
from vllm.v1.metrics.stats import PrefixCacheStats  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from pagedkv.core.manager import KVCacheManager  # noqa: E402
from pagedkv.errors import PagedKVError  # noqa: E402
from pagedkv.vllm.blocks import (  # noqa: E402
    BlockPoolView,
    BlockTable,
    EmptyBlocks,
    PagedKVBlocks,
    coordinator_view,
)
from pagedkv.vllm.entry import install_entry  # noqa: E402
from pagedkv.vllm.events import EventConverter  # noqa: E402
from pagedkv.vllm.extras import pin_of, retention_of  # noqa: E402
from pagedkv.vllm.layout import cache_config_for  # noqa: E402
from pagedkv.vllm.requests import RequestView  # noqa: E402
from pagedkv.vllm.zeroing import skipping_zeroing  # noqa: E402

__all__ = ["VLLMKVCacheManager"]

_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
_log = logging.getLogger("pagedkv.vllm")


class VLLMKVCacheManager:
    """vLLM's ``KVCacheManager`` members over a pagedkv :class:`~pagedkv.KVCacheManager`
    (``self.pagedkv``: retention, miss attribution, metrics are reached there).

    Raises (at construction):
        UnsupportedLayoutError: a layout or option pagedkv does not run exactly.
    """

    def __init__(self, kv_cache_config: Any, max_model_len: int, *,
                 enable_caching: bool = True, log_stats: bool = False,
                 enable_kv_cache_events: bool = False, watermark: float = 0.0,
                 max_encoder_len: int = 0, cache_fields: dict[str, Any] | None = None) -> None:
        fields = dict(cache_fields or {})
        fields.setdefault("enable_caching", enable_caching)
        fields.setdefault("enable_events", enable_kv_cache_events)
        config = cache_config_for(kv_cache_config, max_model_len=max_model_len,
                                  max_encoder_len=max_encoder_len, **fields)
        #: The pagedkv façade underneath (retention, observe, host tier, metrics).
        self.pagedkv = KVCacheManager(config)
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.log_stats = log_stats
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.mamba_shared_prefix_checkpoint = False
        self.use_eagle = bool(fields.get("drop_last_hit", False))
        self._hash_block_size = self.pagedkv.pool.hash_block_size
        # The junction (see _junction) is computed on Mamba hybrids with a full-attention
        # group, as vLLM's hybrid coordinator computes it.
        kinds = [type(g.kv_cache_spec).__name__ for g in kv_cache_config.kv_cache_groups]
        self._junction_group: int | None = None
        self._junction_block_size = 0
        if ("MambaSpec" in kinds and len(set(kinds)) > 1 and enable_caching
                and not fields.get("drop_last_hit")):
            for g, kind in enumerate(kinds):
                if kind in ("FullAttentionSpec", "MLAAttentionSpec"):
                    self._junction_group = g
                    self._junction_block_size = int(
                        kv_cache_config.kv_cache_groups[g].kv_cache_spec.block_size)
                    break
        self._table = BlockTable(self.pagedkv)
        self.block_pool = BlockPoolView(self.pagedkv, self._table)
        specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        self.coordinator = coordinator_view(self.pagedkv, self._table, specs, self.block_pool)
        self.empty_kv_cache_blocks = EmptyBlocks(tuple(() for _ in specs))
        self._views: dict[str, RequestView] = {}
        self._events = EventConverter(kv_cache_config)
        #: pagedkv's Prometheus exporter (``additional_config["pagedkv"]["metrics_port"]``).
        self.exporter: Any = None
        #: The port the exporter serves on (None without one).
        self.metrics_port: int | None = None
        self._pending_events: list[Any] = []
        self._warned_report_mode = False
        install_entry(self, _ADMITTING)  # the steady-state calls in C

    # ------------------------------------------------------------------ requests

    def _view(self, request: Any) -> RequestView:
        """The request's view: the live one while it holds blocks, else a new one."""
        view = self._views.get(request.request_id)
        if view is None or view.request is not request:
            view = RequestView(request, retention_of(request))
        return view

    def _drain_events(self, request: Any) -> None:
        if self.enable_kv_cache_events:
            records = self.pagedkv.take_events()
            if records:
                session = getattr(request, "session_id", None) if request is not None else None
                self._pending_events += self._events.convert(records, session)

    # ------------------------------------------------------------------ statistics

    @property
    def usage(self) -> float:
        return self.pagedkv.usage

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """vLLM's interval statistics; pagedkv's own interval goes to the Prometheus
        exporter when one is attached (``exporter``), else it is dropped."""
        if self.exporter is not None:
            self.exporter.record(self.pagedkv)
        else:
            self.pagedkv.make_prefix_cache_stats()
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        if not self.prefix_cache_lookup_enabled(request):
            return
        self.pagedkv.record_lookup(self._view(request), min(num_hits, request.num_tokens))
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                           preempted=request.num_preemptions > 0)

    # ------------------------------------------------------------------ lookup

    def get_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None
                            ) -> tuple[PagedKVBlocks, int, int]:
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        if (self.enable_kv_cache_events and not self._warned_report_mode
                and getattr(request, "kv_cache_report_mode", "incremental") == "full"):
            self._warned_report_mode = True
            _log.warning("pagedkv.vllm: kv_cache_report_mode='full' is not supported; reused "
                         "blocks are not re-announced as stored events")
        view = self._view(request)
        limit = request.num_tokens - 1 if max_cache_hit_length is None else min(
            max_cache_hit_length, request.num_tokens)
        hit = self.pagedkv.lookup_prefix(view, max(limit, 0), record_stats=False)
        n = hit.num_computed_tokens
        boundary = self._junction(request.block_hashes, limit, n)
        if not n and not any(hit.block_ids):
            return self.empty_kv_cache_blocks, 0, boundary
        return self._table.blocks(hit.block_ids, hit), n, boundary

    def _junction(self, block_hashes: list[bytes], limit: int, num_hit: int) -> int:
        """vLLM's ``shared_prefix_boundary`` on a Mamba hybrid: where the full-attention
        group's own hit ends when it runs past the hit every group agrees on (a prefix
        shared with earlier requests whose Mamba state is not cached yet; the scheduler
        stops a chunk there so that the state gets cached), else 0."""
        g = self._junction_group
        if g is None or num_hit >= limit:
            return 0
        step = self._junction_block_size // self._hash_block_size
        cached = self.pagedkv.get_cached_block
        longest = 0
        for end in range(step, min(len(block_hashes), limit // self._hash_block_size) + 1,
                         step):
            if cached(block_hashes[end - 1], (g,)) is None:
                break
            longest = end * self._hash_block_size
        return longest if longest > num_hit else 0

    def get_computed_blocks_for_connector(self, request: Any,
                                          max_cache_hit_length: int | None = None
                                          ) -> tuple[PagedKVBlocks, int, int, bool]:
        """vLLM's lookup for a connector that restores lagging groups' state: on a Mamba
        hybrid with a full-attention group, the full-attention group's own hit (unless a
        group hit deeper), flagged when another group lags (``lookup_prefix_per_group``);
        else :meth:`get_computed_blocks`."""
        fa = self.coordinator.full_attention_group_id
        if not (self.kv_cache_config.has_mamba_layers and self.enable_caching
                and self.num_kv_cache_groups > 1 and fa is not None):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0, False
        limit = request.num_tokens - 1 if max_cache_hit_length is None else min(
            max_cache_hit_length, request.num_tokens)
        hit = self.pagedkv.lookup_prefix_per_group(self._view(request), max(limit, 0),
                                                   reference_group=fa)
        lengths = hit.group_tokens or ()
        if any(n > lengths[fa] for n in lengths):
            # A lagging group hit deeper: full attention's tail was evicted.
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        n = lengths[fa]
        blocks = (self._table.blocks(hit.block_ids, hit) if any(hit.block_ids)
                  else self.empty_kv_cache_blocks)
        return blocks, n, 0, min(lengths) < n

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        hit = getattr(blocks, "hit", None)
        if hit is None:
            return blocks
        cut = self.pagedkv.truncate_computed_blocks(hit, num_computed_tokens)
        if not any(cut.block_ids):
            return self.empty_kv_cache_blocks
        return self._table.blocks(cut.block_ids, cut)

    # ------------------------------------------------------------------ allocation

    def allocate_slots(self, request: Any, num_new_tokens: int,
                       num_new_computed_tokens: int = 0, new_computed_blocks: Any = None,
                       num_lookahead_tokens: int = 0, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False, num_encoder_tokens: int = 0,
                       full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True,
                       skip_zeroing_group_ids: tuple[int, ...] = ()) -> PagedKVBlocks | None:
        if not (num_new_tokens or num_external_computed_tokens or num_new_computed_tokens):
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "computed tokens to adopt")
        view = self._views.get(request.request_id)
        if (view is not None and view.request is request and new_computed_blocks is None
                and not (num_lookahead_tokens or num_external_computed_tokens
                         or num_encoder_tokens or delay_cache_blocks or reserved_blocks
                         or full_sequence_must_fit)
                and not (self.watermark_blocks and has_scheduled_reqs
                         and request.status in _ADMITTING)):
            # The steady-state decode call (a live request, nothing but new tokens): only
            # the engine's counting as keywords, which the compiled core's allocate_slots
            # (pagedkv.core.fast_paths) takes itself; it means what the general call
            # (_allocate_general) means for these arguments.
            in_flight = request.num_in_flight_tokens
            if in_flight:
                in_flight = min(in_flight, request.num_computed_tokens)
            new = self.pagedkv.allocate_slots(view, num_new_tokens,
                                              num_in_flight_tokens=in_flight,
                                              lenient_counts=True)
            if self.enable_kv_cache_events:
                self._drain_events(request)
            if new is None:
                return None
            return self._table.blocks(new) if any(new) else self.empty_kv_cache_blocks
        return self._allocate_first(
            request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
            (num_lookahead_tokens, num_external_computed_tokens, num_encoder_tokens),
            (delay_cache_blocks, reserved_blocks, has_scheduled_reqs, full_sequence_must_fit),
            skip_zeroing_group_ids)

    def _allocate_first(self, request: Any, num_new_tokens: int,
                        num_new_computed_tokens: int, new_computed_blocks: Any,
                        counts: tuple[int, int, int], flags: tuple[bool, int, bool, bool],
                        skip_zeroing_group_ids: tuple[int, ...]) -> PagedKVBlocks | None:
        """:meth:`allocate_slots` for every call but the steady-state decode one: a
        request's first allocation (a hit to adopt, the watermark), lookahead, external,
        encoder tokens, delayed caching, a reserve."""
        hit = getattr(new_computed_blocks, "hit", None)
        if new_computed_blocks is not None and hit is None and any(new_computed_blocks.blocks):
            raise ValueError("new_computed_blocks must come from this manager's "
                             "get_computed_blocks")
        delay_cache_blocks, reserved, has_scheduled_reqs, full_sequence_must_fit = flags
        view = self._view(request)
        mgr = self.pagedkv
        live = view.request_id in mgr.live_requests
        if (self.watermark_blocks and live and has_scheduled_reqs
                and request.status in _ADMITTING):
            reserved += self.watermark_blocks  # vLLM: by status, pagedkv: by first call
        in_flight = request.num_in_flight_tokens
        if in_flight:
            in_flight = min(in_flight, request.num_computed_tokens)
        with skipping_zeroing(mgr, skip_zeroing_group_ids if counts[1] else ()):
            new = self._allocate_general(
                view, request, num_new_tokens, hit, num_new_computed_tokens, counts,
                (delay_cache_blocks, reserved, has_scheduled_reqs, full_sequence_must_fit),
                in_flight)
        self._drain_events(request)
        if new is None:
            return None
        if not live:
            self._views[view.request_id] = view
            if mgr.retention is not None:
                self._pin_asked(view)
        if not any(new):
            return self.empty_kv_cache_blocks
        return self._table.blocks(new)

    def _allocate_general(self, view: RequestView, request: Any, num_new_tokens: int,
                          hit: Any, num_new_computed_tokens: int,
                          counts: tuple[int, int, int], flags: tuple[bool, int, bool, bool],
                          in_flight: int) -> tuple[list[int], ...] | None:
        """The façade's ``allocate_slots`` with every vLLM argument, as keywords."""
        lookahead, external, encoder = counts
        delay, reserved, has_scheduled_reqs, full_sequence_must_fit = flags
        return self.pagedkv.allocate_slots(
            view, num_new_tokens, new_computed_blocks=hit,
            num_new_computed_tokens=num_new_computed_tokens if hit is not None else None,
            num_lookahead_tokens=lookahead, num_external_computed_tokens=external,
            num_encoder_tokens=encoder, delay_caching=delay, reserved_blocks=reserved,
            has_scheduled_reqs=has_scheduled_reqs,
            full_sequence_must_fit=full_sequence_must_fit,
            num_in_flight_tokens=in_flight, lenient_counts=True)

    def _pin_asked(self, view: RequestView) -> None:
        """Pin the prompt prefix a newly admitted request asks to pin (extras)."""
        ask = pin_of(view.request)
        if ask is None:
            return
        n = view.num_prompt_tokens if ask.num_tokens is None else min(
            ask.num_tokens, view.num_prompt_tokens)
        try:
            self.pagedkv.retention.pin_prefix(view, ttl_s=ask.ttl_s, num_tokens=n,
                                              refresh_on_hit=ask.refresh_on_hit)
        except PagedKVError as e:
            _log.warning("request %s: pagedkv pin dropped: %s", view.request_id, e)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        view = self._views.get(request.request_id)
        if view is None or view.request is not request:
            if not self.pagedkv.has_request(request.request_id):
                return
            view = self._view(request)
        # Only as far as the request has block hashes; the façade caps at its tokens
        # (the compiled core's cache_blocks takes this call, pagedkv.core.fast_paths).
        hashed = len(request.block_hashes) * self._hash_block_size
        self.pagedkv.cache_blocks(view, min(num_computed_tokens, hashed))
        if self.enable_kv_cache_events:
            self._drain_events(request)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        if self.pagedkv.has_request(request_id):
            self.pagedkv.remove_skipped_blocks(request_id, max(0, processed_computed_tokens))

    def new_step_starts(self) -> None:
        self.pagedkv.new_step_starts()

    # ------------------------------------------------------------------ freeing

    def free(self, request: Any) -> None:
        view = self._views.pop(request.request_id, None)
        self.pagedkv.free(view if view is not None else request.request_id)

    def pop_blocks_for_free(self, request: Any) -> list[Any]:
        view = self._views.pop(request.request_id, None)
        ids = self.pagedkv.pop_blocks_for_free(
            view if view is not None else request.request_id)
        return self._table.of(ids)

    def evict_blocks(self, block_ids: Any) -> None:
        self.pagedkv.evict_blocks(list(block_ids))
        self._drain_events(None)

    def reset_prefix_cache(self) -> bool:
        if not self.pagedkv.reset_prefix_cache():
            return False
        self._drain_events(None)
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.reset = True
        return True

    # ------------------------------------------------------------------ queries

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def take_events(self) -> list[Any]:
        self._drain_events(None)
        events, self._pending_events = self._pending_events, []
        return events

    def get_blocks(self, request_id: str) -> PagedKVBlocks:
        if not self.pagedkv.has_request(request_id):
            return self.empty_kv_cache_blocks
        tables = self.pagedkv.get_block_ids(request_id)
        return self._table.blocks(tables) if any(tables) else self.empty_kv_cache_blocks

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        if not self.pagedkv.has_request(request_id):
            return tuple([] for _ in range(self.num_kv_cache_groups))
        return self.pagedkv.get_block_ids(request_id)

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int
                                          ) -> tuple[list[int], ...]:
        if not self.pagedkv.has_request(request_id):
            return tuple([] for _ in range(self.num_kv_cache_groups))
        return self.pagedkv.get_block_ids_for_computed_tokens(request_id, num_computed_tokens)

    def estimate_cached_tokens(self, request: Any) -> int:
        return self.pagedkv.estimate_cached_tokens(self._view(request))

    def create_kv_cache_blocks(self, blocks: Any) -> Any:
        return PagedKVBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def take_new_block_ids(self) -> list[int]:
        return self.pagedkv.take_new_block_ids()

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        self.pagedkv.record_blocks_for_zeroing(request_id, start_token)

    def take_kv_cache_block_copies(self) -> tuple[list[KVCacheBlockCopy], list[Any]]:
        copies = self.pagedkv.take_block_copies()
        pairs = [(c.src_block_id, c.dst_block_id) for c in copies.copies]
        retained = self._table.of(copies.retained)
        for group in self.coordinator.single_type_managers:
            # Copies queued from outside (vLLM's code and tests append to a group's
            # _pending_cow_copies), whose endpoints their queuer keeps referenced.
            for src, dst in group.take_pending_cow_copies():
                pairs.append((src.block_id, dst.block_id))
                retained += (src, dst)
        return [KVCacheBlockCopy(a, b) for a, b in pairs], retained

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        return self.pagedkv.take_boundary_state_offloads()

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        return self.pagedkv.finalize_partial_tail_offloads(
            request.request_id, request.num_computed_tokens, request.num_in_flight_tokens)
