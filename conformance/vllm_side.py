"""The vLLM side: vLLM's own ``KVCacheManager`` driven the way its scheduler drives it.

Only imported under an interpreter that has vLLM; nothing here is pagedkv code.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from conformance.layouts import GroupDesc, Layout
from conformance.model import ReqDesc, Snapshot

__all__ = ["VllmSide", "vllm_available"]


def vllm_available() -> str | None:
    """None when vLLM can be imported here, else the reason."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # any import failure means "not usable here"
        return f"{type(exc).__name__}: {exc}"
    return None


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM derives its root hash from PYTHONHASHSEED when it is set; pagedkv uses the fixed
    # default seed, which is vLLM's default too.
    os.environ.pop("PYTHONHASHSEED", None)


class VllmSide:
    """One vLLM manager for ``layout`` with caching, statistics and events on."""

    name = "vllm"

    def __init__(self, layout: Layout) -> None:
        _quiet()
        import logging

        import torch
        from vllm.distributed.kv_events import KVEventBatch
        from vllm.lora.request import LoRARequest
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.request import Request, RequestStatus

        logging.getLogger("vllm").setLevel(logging.ERROR)
        self._torch = torch
        self._Request = Request
        self._Status = RequestStatus
        self._LoRARequest = LoRARequest
        self._Feature = MultiModalFeatureSpec
        self._Placeholder = PlaceholderRange
        self._Batch = KVEventBatch
        import msgspec

        self._encode = msgspec.msgpack.Encoder().encode
        hash_fn = get_hash_fn_by_name("sha256_cbor")
        init_none_hash(hash_fn)
        groups = [
            KVCacheGroupSpec([f"layers.{i}.{g.kind}"], self._spec(g))
            for i, g in enumerate(layout.groups)
        ]
        cfg = KVCacheConfig(
            num_blocks=layout.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
        )
        lookahead = (
            {"num_hash_lookahead_tokens": layout.num_hash_lookahead_tokens}
            if layout.num_hash_lookahead_tokens
            else {}
        )
        self.mgr = KVCacheManager(
            cfg,
            max_model_len=layout.max_model_len,
            scheduler_block_size=layout.scheduler_block_size,
            hash_block_size=layout.hash_block_size,
            enable_caching=True,
            log_stats=True,
            enable_kv_cache_events=True,
            watermark=0.1,  # pagedkv_side.WATERMARK (this module imports no pagedkv code)
            max_in_flight_tokens=16,  # pagedkv_side.MAX_IN_FLIGHT_TOKENS
            **({"num_prefill_lookahead": layout.num_prefill_lookahead_tokens}
               if layout.num_prefill_lookahead_tokens else {}),
            **({"use_eagle": True} if layout.use_eagle else {}),
            # vLLM 0.32 has no hash lookahead (its layouts leave it out: layouts_for)
            **lookahead,
        )
        self.hasher = get_request_block_hasher(
            layout.hash_block_size, hash_fn, *lookahead.values()
        )
        self.sp = SamplingParams(max_tokens=1 << 20)
        self.reqs: dict[str, Any] = {}
        self._hits: dict[str, Any] = {}
        self._deferred: list[list[Any]] = []

    def _spec(self, g: GroupDesc) -> Any:
        from vllm.v1 import kv_cache_interface as kci

        dt = self._torch.bfloat16
        common: dict[str, Any] = dict(
            block_size=g.block_size, num_kv_heads=2, head_size=16, dtype=dt
        )
        if g.kind == "full":
            return kci.FullAttentionSpec(**common)
        if g.kind == "mla":
            return kci.MLAAttentionSpec(
                block_size=g.block_size, num_kv_heads=1, head_size=32, dtype=dt
            )
        if g.kind == "swa":
            return kci.SlidingWindowSpec(**common, sliding_window=g.window_tokens)
        if g.kind == "chunked":
            return kci.ChunkedLocalAttentionSpec(**common, attention_chunk_size=g.window_tokens)
        if g.kind == "swamla":
            return kci.SlidingWindowMLASpec(
                block_size=g.block_size, num_kv_heads=1, head_size=32, dtype=dt,
                sliding_window=g.window_tokens, bounded_replay=True,
            )
        if g.kind == "mamba":
            return kci.MambaSpec(
                block_size=g.block_size,
                shapes=((2, 16),),
                dtypes=(self._torch.float32,),
                mamba_cache_mode="align",
            )
        raise ValueError(f"unknown group kind {g.kind!r}")

    # ------------------------------------------------------------------ requests

    def new_request(self, d: ReqDesc) -> None:
        lora = None
        if d.lora is not None:
            lora = self._LoRARequest(
                lora_name=d.lora[0], lora_int_id=d.lora[1], lora_path=d.lora[2]
            )
        mm = [
            self._Feature(
                data=None,
                modality="image",
                identifier=ident,
                mm_position=self._Placeholder(offset=off, length=length),
            )
            for ident, off, length in d.mm
        ] or None
        req = self._Request(
            request_id=d.request_id,
            prompt_token_ids=list(d.prompt),
            sampling_params=self.sp,
            pooling_params=None,
            mm_features=mm,
            lora_request=lora,
            cache_salt=d.salt,
            block_hasher=self.hasher,
        )
        self.reqs[d.request_id] = req

    def append_token(self, rid: str, token: int) -> None:
        self.reqs[rid].append_output_token_ids(token)

    def lookup(self, rid: str) -> tuple[int, tuple[list[int], ...]]:
        req = self.reqs[rid]
        blocks, num_hit, _boundary = self.mgr.get_computed_blocks(req)
        self.mgr.record_prefix_cache_stats(req, num_hit)
        self._hits[rid] = (blocks, num_hit)
        return num_hit, blocks.get_block_ids()

    def truncate(self, rid: str, num_tokens: int) -> tuple[int, tuple[list[int], ...]]:
        blocks, _num_hit = self._hits[rid]
        cut = self.mgr.truncate_computed_blocks(blocks, num_tokens)
        self._hits[rid] = (cut, num_tokens)
        return num_tokens, cut.get_block_ids()

    def lookup_groups(self, rid: str) -> tuple[list[int], tuple[list[int], ...]]:
        """Each group's own hit (``find_longest_cache_hit_per_group``, as
        ``get_computed_blocks_for_connector`` asks), group 0 the reference."""
        req = self.reqs[rid]
        computed, lengths = self.mgr.coordinator.find_longest_cache_hit_per_group(
            req.block_hashes, req.num_tokens - 1
        )
        blocks = self.mgr.create_kv_cache_blocks(computed)
        self._hits[rid] = (blocks, lengths[0])
        return list(lengths), blocks.get_block_ids()

    def allocate(
        self, rid: str, num_new: int, lookahead: int, use_hit: bool,
        reserved: int = 0, has_scheduled: bool = True, must_fit: bool = False,
        external: int = 0, skip_zeroing: tuple[int, ...] = (), delay: bool = False,
    ) -> tuple[list[int], ...] | None:
        req = self.reqs[rid]
        blocks, num_hit = self._hits.pop(rid) if use_hit else (None, 0)
        loads = ({"num_external_computed_tokens": external, "delay_cache_blocks": delay,
                  "skip_zeroing_group_ids": skip_zeroing} if external else {})
        out = self.mgr.allocate_slots(
            req, num_new, num_hit, blocks, num_lookahead_tokens=lookahead,
            reserved_blocks=reserved, has_scheduled_reqs=has_scheduled,
            full_sequence_must_fit=must_fit, **loads,
        )
        if out is None:
            return None
        return out.get_block_ids()

    def take_offloads(self) -> dict[str, list[list[int]]]:
        return {rid: [list(x) for x in found]
                for rid, found in self.mgr.take_boundary_state_offloads().items()}

    def finalize_tails(self, rid: str) -> list[list[int]]:
        return [list(x) for x in self.mgr.finalize_partial_tail_offloads(self.reqs[rid])]

    def evict(self, block_id: int) -> None:
        self.mgr.evict_blocks({block_id})

    def estimate(self, rid: str) -> int:
        return int(self.mgr.estimate_cached_tokens(self.reqs[rid]))

    def commit(self, rid: str, num_tokens: int) -> None:
        req = self.reqs[rid]
        req.num_computed_tokens = num_tokens
        req.status = self._Status.RUNNING

    def free(self, rid: str) -> None:
        self.mgr.free(self.reqs.pop(rid))

    def pop_for_free(self, rid: str) -> list[int]:
        blocks = self.mgr.pop_blocks_for_free(self.reqs.pop(rid))
        if blocks:
            self._deferred.append(blocks)
        return [b.block_id for b in blocks]

    def release_deferred(self) -> None:
        for blocks in self._deferred:
            self.mgr.block_pool.free_blocks(reversed(blocks))
        self._deferred = []

    def zero_from(self, rid: str, start_token: int) -> None:
        self.mgr.record_blocks_for_zeroing(rid, start_token)

    def take_copies(self) -> list[tuple[int, int]]:
        """The step's block copies; the retained blocks are released right away (the
        copies run with the step), as vLLM's scheduler does without deferred frees."""
        copies, retained = self.mgr.take_kv_cache_block_copies()
        if retained:
            self.mgr.block_pool.free_blocks(retained)
        return [(c.src_block_id, c.dst_block_id) for c in copies]

    def take_zeroing(self) -> list[int]:
        return list(self.mgr.take_new_block_ids())

    def preempt(self, rid: str) -> None:
        req = self.reqs[rid]
        self.mgr.free(req)
        req.status = self._Status.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1

    def new_step(self) -> None:
        self.mgr.new_step_starts()

    def reset(self) -> bool:
        return bool(self.mgr.reset_prefix_cache())

    # ------------------------------------------------------------------ observation

    def block_hashes(self, rid: str) -> list[bytes]:
        return [bytes(h) for h in self.reqs[rid].block_hashes]

    def snapshot(self, with_tables: bool = True) -> Snapshot:
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id

        pool = self.mgr.block_pool
        free_order = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        cached: dict[int, tuple[int, bytes]] = {}
        for b in pool.blocks:
            key = b.block_hash
            if key is not None:
                cached[b.block_id] = (get_group_id(key), bytes(get_block_hash(key)))
        st = self.mgr.make_prefix_cache_stats()
        stats = (
            st.requests,
            st.queries,
            st.hits,
            st.preempted_requests,
            st.preempted_queries,
            st.preempted_hits,
        )
        # A request whose every group table is empty holds nothing (vLLM may keep an
        # empty entry after a refused first allocation; pagedkv keeps none).
        tables = {
            rid: t
            for rid in self.reqs
            if self._holds(rid)
            for t in [self.mgr.get_block_ids(rid)]
            if any(t)
        }
        events = self.mgr.take_events()
        payload = (
            self._encode(self._Batch(ts=0.0, events=events, data_parallel_rank=0))
            if events
            else b""
        )
        return Snapshot(
            num_free=pool.get_num_free_blocks(),
            usage=round(self.mgr.usage, 9),
            stats=stats,
            free_order=tuple(free_order),
            cached=cached,
            tables=tables,
            events=payload,
        )

    def _holds(self, rid: str) -> bool:
        mgr0 = self.mgr.coordinator.single_type_managers[0]
        return rid in mgr0.req_to_blocks
