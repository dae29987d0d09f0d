"""pagedkv inside vLLM's scheduler: KV events equal to vLLM's own byte for byte (LoRA,
session, medium, group fields), retention asked for in a request's ``extra_args``, the
Prometheus exporter, explicit refusals, the general plugin."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (pip install 'pagedkv[vllm]')")

from vllm_sched_support import build_scheduler, make_requests, run


class _Recorder:
    """Stands in for vLLM's event publisher: keeps every batch's events."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, batch: Any) -> None:
        self.events.extend(batch.events)

    def shutdown(self) -> None:
        pass


def _event_bytes(tmp: Path, cls: str, window: int | None) -> list[bytes]:
    import msgspec

    s = build_scheduler(tmp, cls, async_scheduling=False, num_blocks=30, window=window,
                        kv_events=True)
    s.kv_event_publisher = _Recorder()
    run(s, make_requests(18, metadata=True, num_prefixes=3))
    enc = msgspec.msgpack.Encoder()
    return [enc.encode(e) for e in s.kv_event_publisher.events]


@pytest.mark.parametrize("window", [None, 32], ids=["full", "full+swa"])
def test_kv_events_are_the_bytes_vllms_manager_publishes(tmp_path: Path,
                                                         window: int | None) -> None:
    want = _event_bytes(tmp_path, "vllm.v1.core.sched.scheduler.Scheduler", window)
    got = _event_bytes(tmp_path, "pagedkv.vllm.PagedKVScheduler", window)
    joined = b"".join(want)
    assert b"BlockStored" in joined and b"BlockRemoved" in joined, "must store and evict"
    assert b"session-1" in joined and b"sql" in joined and b"tenant-1" in joined
    assert got == want


def _retention_state(tmp: Path, extra_args: dict[str, Any] | None) -> dict[str, Any]:
    s = build_scheduler(tmp, "pagedkv.vllm.PagedKVScheduler", async_scheduling=False,
                        num_blocks=200, window=None,
                        additional_config={"pagedkv": {"retention": {}}})
    run(s, make_requests(2, extra_args=extra_args))
    mgr = s.kv_cache_manager.pagedkv
    assert mgr.retention is not None
    return mgr.debug_state()


def test_retention_from_a_requests_extra_args_reaches_the_freed_blocks(tmp_path: Path) -> None:
    asked = {"pagedkv": {"retention": {"ranges": [{"start": 0, "end": 48, "priority": 90}],
                                       "decode_priority": 5}}}
    plain = _retention_state(tmp_path, None)
    kept = _retention_state(tmp_path, asked)
    assert plain["block_tables"] == kept["block_tables"]
    assert plain != kept  # the freed blocks carry the asked priorities


def test_a_malformed_retention_is_ignored_and_the_request_runs(tmp_path: Path) -> None:
    s = build_scheduler(tmp_path, "pagedkv.vllm.PagedKVScheduler", async_scheduling=False,
                        num_blocks=200, window=None,
                        additional_config={"pagedkv": {"retention": {}}})
    trace = run(s, make_requests(1, extra_args={"pagedkv": {"retention": {"bogus": 1}}}))
    assert trace.steps


def test_prometheus_metrics_are_served_at_each_stats_interval(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    s = build_scheduler(tmp_path, "pagedkv.vllm.PagedKVScheduler", async_scheduling=False,
                        num_blocks=200, window=None,
                        additional_config={"pagedkv": {"metrics_port": 0, "observe": {}}})
    exporter = s.kv_cache_manager.exporter
    try:
        run(s, make_requests(4))
        s.make_stats()
        port = s.kv_cache_manager.metrics_port
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"pagedkv_prefix_cache_hits_total" in body
        assert b"pagedkv_prefix_cache_requests_total 4.0" in body
    finally:
        exporter.close()


def test_an_unsupported_layout_is_refused_at_construction_in_one_line(tmp_path: Path) -> None:
    import torch
    from vllm.v1.kv_cache_interface import (
        EncoderOnlyAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )

    from pagedkv.vllm.layout import UnsupportedLayoutError, cache_config_for

    spec = EncoderOnlyAttentionSpec(block_size=16, num_kv_heads=1, head_size=16,
                                    dtype=torch.float16)
    cfg = KVCacheConfig(num_blocks=10, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["x"], spec)])
    with pytest.raises(UnsupportedLayoutError) as err:
        cache_config_for(cfg, max_model_len=128)
    msg = str(err.value)
    assert "\n" not in msg and "EncoderOnlyAttentionSpec" in msg
    assert "without --scheduler-cls" in msg


def test_the_plugin_sets_the_default_scheduler_class_only_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.config import SchedulerConfig

    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler, plugin

    original = SchedulerConfig.get_scheduler_cls
    monkeypatch.setattr(SchedulerConfig, "get_scheduler_cls", original)
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    plugin.register()
    assert SchedulerConfig.get_scheduler_cls is original
    monkeypatch.setenv(plugin.ENV_VAR, "1")
    plugin.register()
    plugin.register()  # idempotent
    sync = SchedulerConfig(max_model_len=512, is_encoder_decoder=False)
    assert sync.get_scheduler_cls() is PagedKVScheduler
    both = SchedulerConfig(max_model_len=512, is_encoder_decoder=False, async_scheduling=True)
    assert both.get_scheduler_cls() is PagedKVAsyncScheduler


def test_a_mamba_hybrid_without_full_attention_is_refused(tmp_path: Path) -> None:
    import torch
    from vllm.v1.kv_cache_interface import (
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    from pagedkv.vllm.layout import UnsupportedLayoutError, cache_config_for

    groups = [
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=1,
                                                    dtype=torch.float32, sliding_window=32)),
        KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((1, 1),),
                                          dtypes=(torch.float32,), mamba_cache_mode="align")),
    ]
    cfg = KVCacheConfig(num_blocks=10, kv_cache_tensors=[], kv_cache_groups=groups)
    with pytest.raises(UnsupportedLayoutError, match="without a full-attention group"):
        cache_config_for(cfg, max_model_len=128)
    assert cache_config_for(cfg, max_model_len=128, enable_caching=False).num_blocks == 10


def test_a_request_can_pin_its_prompt_prefix(tmp_path: Path) -> None:
    s = build_scheduler(tmp_path, "pagedkv.vllm.PagedKVScheduler", async_scheduling=False,
                        num_blocks=200, window=None,
                        additional_config={"pagedkv": {"retention": {}}})
    asked = {"pagedkv": {"pin": {"ttl_s": 3600, "num_tokens": 48}}}
    run(s, make_requests(1, extra_args=asked))
    retention = s.kv_cache_manager.pagedkv.retention
    assert retention.num_pinned_blocks == 3  # 48 tokens of 16-token blocks, held
    bad = {"pagedkv": {"pin": {"ttl_s": -1}}}
    s2 = build_scheduler(tmp_path, "pagedkv.vllm.PagedKVScheduler", async_scheduling=False,
                         num_blocks=200, window=None,
                         additional_config={"pagedkv": {"retention": {}}})
    run(s2, make_requests(1, extra_args=bad))  # logged and ignored; the request runs
    assert s2.kv_cache_manager.pagedkv.retention.num_pinned_blocks == 0
