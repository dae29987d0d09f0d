"""The clock's pieces the CPU-engine ground truth needs: a GPU spec that measured its own
GEMM ramp, recorded send times in a measured file (the replay starts the streams when
theirs started), and the ``offline`` constant set."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pagedkv.errors import InputFileError
from pagedkv.planner.gpus import GpuSpec, find_gpu, load_gpu_spec
from pagedkv.sim.clock.constants import CONSTANT_SETS, load_constants
from pagedkv.sim.clock.measured import Measured, load_measured
from pagedkv.sim.clock.replay import ReplaySetup, replay_times
from pagedkv.sim.clock.roofline import RooflineStepModel
from pagedkv.sim.clock.shape import model_shape

_CPU = {"bf16_tflops": 0.1, "hbm_tb_s": 0.02, "memory_gib": 8}


def _spec(tmp_path: Path, **extra: object) -> GpuSpec:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({**_CPU, **extra}))
    return load_gpu_spec(path)


def test_a_measured_gemm_ramp_replaces_the_default(tmp_path: Path) -> None:
    shape = model_shape("Llama-3.1-8B")
    plain = RooflineStepModel.build(shape, _spec(tmp_path))
    ramped = RooflineStepModel.build(shape, _spec(tmp_path, gemm_half_tokens=4))
    # one decoding sequence: compute-bound on this "GPU"; a ramp of 4 tokens instead of
    # 64 makes its GEMMs 65/5 = 13 times faster
    assert ramped.step_time_s(0, 1) < plain.step_time_s(0, 1) / 5
    ideal = RooflineStepModel.build(shape, _spec(tmp_path, gemm_half_tokens=4),
                                    CONSTANT_SETS["ideal"])
    assert ideal.step_time_s(0, 1) <= ramped.step_time_s(0, 1)


@pytest.mark.parametrize("bad", [0, -1, "8", float("nan")])
def test_a_bad_gemm_ramp_is_refused_naming_the_key(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({**_CPU, "gemm_half_tokens": bad}))
    with pytest.raises(InputFileError, match="gemm_half_tokens"):
        load_gpu_spec(path)


def _bench(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"max_concurrency": 2, "input_lens": [512, 512],
                                "output_lens": [8, 8], "ttfts": [0.05, 0.05],
                                "itls": [[0.01] * 7, [0.01] * 7], **extra}))
    return path


def test_send_times_are_read_and_checked(tmp_path: Path) -> None:
    data = load_measured(_bench(tmp_path, arrival_s=[0.0, 0.25]))
    assert [m.sent_s for m in data] == [0.0, 0.25]
    assert [m.sent_s for m in load_measured(_bench(tmp_path))] == [None, None]
    with pytest.raises(InputFileError, match="arrival_s"):
        load_measured(_bench(tmp_path, arrival_s=[0.0]))
    with pytest.raises(InputFileError, match=r"arrival_s\[1\]"):
        load_measured(_bench(tmp_path, arrival_s=[0.0, -1]))


def test_the_replay_starts_streams_when_the_file_says() -> None:
    setup = ReplaySetup(model="Llama-3.1-8B", gpu=find_gpu("H100"))
    one = Measured(input_tokens=2048, output_tokens=4, concurrency=2, ttft_s=0.1,
                   tpot_s=0.01)
    offline = CONSTANT_SETS["offline"]
    together = replay_times([one, one], setup, offline)
    recorded = replay_times([replace(one, sent_s=0.0), replace(one, sent_s=5.0)], setup,
                            offline)
    partial = replay_times([replace(one, sent_s=0.0), one], setup, offline)
    # no recorded times: both streams start together and prefill in one step
    assert together[0][0] == together[1][0]
    # recorded: the second starts 5 s later on an idle engine and prefills alone, as the
    # first did: both wait less than two prompts prefilled together
    t0, t1 = recorded[0][0], recorded[1][0]
    assert t0 is not None and t1 is not None and together[1][0] is not None
    assert t0 == pytest.approx(t1) and t1 < together[1][0]
    # a file that lacks some send times: the streams start together
    assert partial == together


def test_the_offline_set_is_the_default_without_request_latency() -> None:
    offline, default = load_constants("offline"), load_constants("default")
    assert offline.request_latency_s == 0.0 < default.request_latency_s
    assert offline.step_overhead_s == default.step_overhead_s
    assert offline.hbm_efficiency == default.hbm_efficiency
