"""The pagedkv side: :class:`pagedkv.KVCacheManager` for the same layout, driven like the
vLLM side."""

from __future__ import annotations

from typing import Any

import pagedkv
from conformance.layouts import GroupDesc, Layout
from conformance.model import ReqDesc, Snapshot
from pagedkv.core.hashing import HashExtras, LoRA, MultiModalItem
from pagedkv.core.specs_window_mla import SlidingWindowMLASpec
from pagedkv.events.wire import encode_batch

__all__ = ["WATERMARK", "PagedSide"]

#: vLLM's ``watermark`` on both sides: admissions keep this fraction of the pool free
#: when other requests are scheduled.
WATERMARK = 0.1
#: vLLM's ``max_in_flight_tokens`` on both sides (the admission cap of windowed groups
#: under ``full_sequence_must_fit``).
MAX_IN_FLIGHT_TOKENS = 16


def _lora(name: str, adapter_id: int, path: str) -> LoRA:
    return LoRA(name=name, adapter_id=adapter_id, path=path)


class PagedSide:
    """One pagedkv manager for ``layout`` with caching and events on."""

    name = "pagedkv"

    def __init__(self, layout: Layout, release: str = "0.33") -> None:
        """``release``: the vLLM series whose manager this side must match
        (``CacheConfig.vllm_release``)."""
        specs = [self._spec(g) for g in layout.groups]
        self.mgr = pagedkv.KVCacheManager(
            pagedkv.CacheConfig(
                groups=tuple(specs),
                num_blocks=layout.num_blocks,
                max_model_len=layout.max_model_len,
                hash_block_size=layout.hash_block_size,
                enable_events=True,
                watermark=WATERMARK,
                max_in_flight_tokens=MAX_IN_FLIGHT_TOKENS,
                num_hash_lookahead_tokens=layout.num_hash_lookahead_tokens,
                num_prefill_lookahead_tokens=layout.num_prefill_lookahead_tokens,
                drop_last_hit=layout.use_eagle,
                record_boundary_states=layout.connector,
                vllm_release=release,
            )
        )
        self.release = release
        self.reqs: dict[str, Any] = {}
        self._hits: dict[str, Any] = {}
        self._deferred: list[list[int]] = []

    @staticmethod
    def _spec(g: GroupDesc) -> Any:
        common: dict[str, Any] = dict(
            block_size=g.block_size, num_kv_heads=2, head_size=16, dtype_bytes=2
        )
        if g.kind == "full":
            return pagedkv.FullAttentionSpec(**common)
        if g.kind == "mla":
            return pagedkv.MLAAttentionSpec(
                block_size=g.block_size, num_kv_heads=1, head_size=32, dtype_bytes=2
            )
        if g.kind == "swa":
            return pagedkv.SlidingWindowSpec(**common, sliding_window=g.window_tokens)
        if g.kind == "chunked":
            return pagedkv.ChunkedLocalAttentionSpec(**common, attention_chunk_size=g.window_tokens)
        if g.kind == "swamla":
            return SlidingWindowMLASpec(block_size=g.block_size, num_kv_heads=1, head_size=32,
                                        dtype_bytes=2, sliding_window=g.window_tokens,
                                        bounded_replay=True)
        if g.kind == "mamba":
            return pagedkv.MambaSpec(block_size=g.block_size, state_bytes=128)
        raise ValueError(f"unknown group kind {g.kind!r}")

    def new_request(self, d: ReqDesc) -> None:
        extras = HashExtras(
            lora=None if d.lora is None else _lora(*d.lora),
            mm_items=tuple(MultiModalItem(i, o, n) for i, o, n in d.mm),
            cache_salt=d.salt,
        )
        self.reqs[d.request_id] = self.mgr.new_request(
            d.request_id, list(d.prompt), hash_extras=None if extras.is_empty else extras
        )

    def append_token(self, rid: str, token: int) -> None:
        self.reqs[rid].append_output_tokens(token)

    def lookup(self, rid: str) -> tuple[int, tuple[list[int], ...]]:
        hit = self.mgr.get_computed_blocks(self.reqs[rid])
        self._hits[rid] = hit
        return hit.num_computed_tokens, hit.block_ids

    def truncate(self, rid: str, num_tokens: int) -> tuple[int, tuple[list[int], ...]]:
        cut = self.mgr.truncate_computed_blocks(self._hits[rid], num_tokens)
        self._hits[rid] = cut
        return cut.num_computed_tokens, cut.block_ids

    def lookup_groups(self, rid: str) -> tuple[list[int], tuple[list[int], ...]]:
        """Each group's own hit (a connector's lookup), group 0 the reference."""
        hit = self.mgr.lookup_prefix_per_group(self.reqs[rid], reference_group=0)
        self._hits[rid] = hit
        return list(hit.group_tokens or ()), hit.block_ids

    def allocate(
        self, rid: str, num_new: int, lookahead: int, use_hit: bool,
        reserved: int = 0, has_scheduled: bool = True, must_fit: bool = False,
        external: int = 0, skip_zeroing: tuple[int, ...] = (), delay: bool = False,
    ) -> tuple[list[int], ...] | None:
        hit = self._hits.pop(rid) if use_hit else None
        coordinator = self.mgr.coordinator
        coordinator.skip_zeroing_group_ids = skip_zeroing  # vLLM's skip_zeroing_group_ids
        try:
            return self.mgr.allocate_slots(
                self.reqs[rid], num_new, new_computed_blocks=hit,
                num_lookahead_tokens=lookahead, reserved_blocks=reserved,
                has_scheduled_reqs=has_scheduled, full_sequence_must_fit=must_fit,
                num_external_computed_tokens=external, delay_caching=delay,
            )
        finally:
            coordinator.skip_zeroing_group_ids = ()

    def take_offloads(self) -> dict[str, list[list[int]]]:
        return {rid: [list(x) for x in found]
                for rid, found in self.mgr.take_boundary_state_offloads().items()}

    def finalize_tails(self, rid: str) -> list[list[int]]:
        req = self.reqs[rid]
        return [list(x) for x in self.mgr.finalize_partial_tail_offloads(
            rid, req.num_computed_tokens, 0)]

    def evict(self, block_id: int) -> None:
        self.mgr.evict_blocks([block_id])

    def pop_for_free(self, rid: str) -> list[int]:
        blocks = self.mgr.pop_blocks_for_free(self.reqs.pop(rid))
        if blocks:
            self._deferred.append(blocks)
        return blocks

    def release_deferred(self) -> None:
        for blocks in self._deferred:
            self.mgr.release_blocks(blocks[::-1])
        self._deferred = []

    def zero_from(self, rid: str, start_token: int) -> None:
        self.mgr.record_blocks_for_zeroing(rid, start_token)

    def take_copies(self) -> list[tuple[int, int]]:
        taken = self.mgr.take_block_copies()
        if taken.retained:
            self.mgr.release_blocks(taken.retained)
        return [(c.src_block_id, c.dst_block_id) for c in taken.copies]

    def take_zeroing(self) -> list[int]:
        return self.mgr.take_new_block_ids()

    def estimate(self, rid: str) -> int:
        return self.mgr.estimate_cached_tokens(self.reqs[rid])

    def commit(self, rid: str, num_tokens: int) -> None:
        self.reqs[rid].num_computed_tokens = num_tokens

    def free(self, rid: str) -> None:
        self.mgr.free(self.reqs.pop(rid))

    def preempt(self, rid: str) -> None:
        req = self.reqs[rid]
        self.mgr.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1

    def new_step(self) -> None:
        self.mgr.new_step_starts()

    def reset(self) -> bool:
        return bool(self.mgr.reset_prefix_cache())

    def block_hashes(self, rid: str) -> list[bytes]:
        return list(self.reqs[rid].block_hashes)

    def snapshot(self, with_tables: bool = True) -> Snapshot:
        state = self.mgr.pool.debug_state()
        cached = {
            b: (g, h)
            for b, (g, h) in enumerate(zip(state["block_group"], state["block_hash"], strict=True))
            if h is not None
        }
        st = self.mgr.make_prefix_cache_stats()
        stats = (
            st.requests,
            st.queries,
            st.hits,
            st.preempted_requests,
            st.preempted_queries,
            st.preempted_hits,
        )
        tables = {
            rid: t
            for rid in self.reqs
            if self.mgr.has_request(rid)
            for t in [self.mgr.get_block_ids(rid)]
            if any(t)
        }
        events = self.mgr.take_events()
        payload = encode_batch(events, timestamp_s=0.0, data_parallel_rank=0) if events else b""
        if self.release == "0.32":
            payload = fixmap_headers(payload)
        return Snapshot(
            num_free=self.mgr.num_free_blocks,
            usage=round(self.mgr.usage, 9),
            stats=stats,
            free_order=tuple(state["free_queue"]),
            cached=cached,
            tables={k: tuple(list(g) for g in v) for k, v in tables.items()},
            events=payload,
        )


_STORED_KEY = b"\xa4type\xabBlockStored"


def fixmap_headers(payload: bytes) -> bytes:
    """``payload`` with each ``BlockStored`` map's map16 header written as a fixmap, as
    vLLM 0.32's encoder writes it (its ``BlockStored`` has 15 fields, 0.33's 16: msgspec
    sizes the header by the struct's field count). pagedkv's wire encoder writes 0.33's
    form; any msgpack reader decodes both to the same event."""
    parts = payload.split(b"\xde\x00")
    out = [parts[0]]
    for part in parts[1:]:
        n = part[0] if part else 16
        if n < 16 and part[1:1 + len(_STORED_KEY)] == _STORED_KEY:
            out.append(bytes((0x80 | n,)) + part[1:])
        else:
            out.append(b"\xde\x00" + part)
    return b"".join(out)
