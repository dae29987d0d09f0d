"""The roofline clock (:mod:`pagedkv.sim.clock`): GPU table and specs, the model shape,
step-time terms per KV-cache kind, calibration round trips, the published validation
points, and the CLI's answers and refusals."""

from __future__ import annotations

import doctest
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv.errors import ConfigError, InputFileError, InvalidArgumentError
from pagedkv.planner.gpus import GPUS, find_gpu, load_gpu_spec, resolve_gpu
from pagedkv.sim import SimConfig, run, system_prompts
from pagedkv.sim.api import with_clock
from pagedkv.sim.clock import RooflineStepModel, model_shape
from pagedkv.sim.clock.calibrate import fit_constants, synthetic_measurements
from pagedkv.sim.clock.constants import CONSTANT_SETS, FITTED, load_constants
from pagedkv.sim.clock.measured import Measured, load_measured
from pagedkv.sim.clock.replay import ReplaySetup
from pagedkv.sim.clock.validation import POINTS, Point, simulate_point
from pagedkv.sim.scheduler import StepTimeModel


@pytest.mark.parametrize("name", [
    "pagedkv.planner.gpus", "pagedkv.sim.clock.shape", "pagedkv.sim.clock.roofline",
    "pagedkv.sim.clock.constants", "pagedkv.sim.clock.calibrate",
    "pagedkv.sim.clock.measured"])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------ GPUs


def test_gpu_table_has_every_asked_gpu_with_dense_figures() -> None:
    assert set(GPUS) == {"A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200",
                         "L40S", "MI300X"}
    for gpu in GPUS.values():
        assert gpu.source and gpu.interconnect
        if gpu.fp8_tflops is not None:  # dense FP8 is twice dense BF16, never the sparse 4x
            assert gpu.fp8_tflops == pytest.approx(2 * gpu.bf16_tflops, rel=0.02)
    assert find_gpu("h100") is GPUS["H100-SXM"] and find_gpu("A100-80gb").memory == "80GiB"
    assert find_gpu("A100-40GB").peak_flops(weight_bytes_per_param=1.0) == 312e12


def test_unknown_gpu_names_the_known_ones() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown GPU .V100.*H100-SXM.*JSON spec"):
        find_gpu("V100")


def test_gpu_spec_file(tmp_path: Path) -> None:
    p = tmp_path / "g.json"
    p.write_text(json.dumps({"bf16_tflops": 100, "hbm_tb_s": 1.0, "memory_gib": 16}))
    gpu = resolve_gpu(str(p))
    assert (gpu.name, gpu.fp8_tflops, gpu.interconnect_gb_s, gpu.memory) == (
        "g", None, 64.0, "16GiB")


@pytest.mark.parametrize(("text", "words"), [
    ('{"bf16_tflops": NaN, "hbm_tb_s": 1, "memory_gib": 8}', "finite number > 0"),
    ('{"bf16_tflops": -5, "hbm_tb_s": 1, "memory_gib": 8}', "finite number > 0"),
    ('{"bf16_tflops": 5, "memory_gib": 8}', "'hbm_tb_s': missing"),
    ('{"bf16_tflops": 5, "hbm_tb_s": 1, "memory_gib": 8, "clock": 2}', "'clock': unknown"),
    ("[1, 2]", "JSON object"),
    ("{", "not valid JSON"),
])
def test_bad_gpu_spec_is_refused(tmp_path: Path, text: str, words: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(InputFileError, match=words):
        load_gpu_spec(p)


# ------------------------------------------------------------------ model shape and terms


def test_moe_reads_active_and_touched_experts() -> None:
    s = model_shape("DeepSeek-V3")
    assert s.num_experts == 256 and s.top_k == 8
    assert 36e9 < s.active_params < 38e9  # DeepSeek-V3: 37B activated of 671B
    assert s.touched_experts(1) == pytest.approx(8)
    assert s.touched_experts(4096) == pytest.approx(256, rel=1e-3)


def test_decode_is_weights_bound_and_long_context_reads_the_kv() -> None:
    """The issue's figures: an 8B decode step streams ~15 GB (>= 4.5 ms on an H100), and
    a 142k-token context reads ~18.6 GB of KV per sequence per step."""
    clock = RooflineStepModel.build(model_shape("Llama-3.1-8B"), find_gpu("H100"))
    ledger = [0.0] * 5
    t = clock.time_of(decode_contexts=[1000], prefill_chunks=(), ledger=ledger)
    assert 15e9 / 3.35e12 < ledger[0] < t
    long = [0.0] * 5
    clock.time_of(decode_contexts=[142_000], prefill_chunks=(), ledger=long)
    kv_bytes = long[2] * 3.35e12 * clock.constants.hbm_efficiency
    assert kv_bytes == pytest.approx(142_001 * 131072, rel=1e-9)  # 18.6 GB


def test_each_kv_kind_reads_its_own_span() -> None:
    """Gemma-3's sliding-window layers read their window, its full layers everything;
    Llama 4's chunked layers the current chunk; Jamba's Mamba layers a fixed state."""
    gpu = find_gpu("H100")
    gemma = RooflineStepModel.build(model_shape("Gemma-3-27B-it"), gpu)
    short, long = ([0.0] * 5 for _ in range(2))
    gemma.time_of(decode_contexts=[2_000], prefill_chunks=(), ledger=short)
    gemma.time_of(decode_contexts=[100_000], prefill_chunks=(), ledger=long)
    window = next(a for a in gemma.shape.attention if a.kind == "window")
    full = next(a for a in gemma.shape.attention if a.kind == "full")
    bw = gpu.hbm_bytes_s * gemma.constants.hbm_efficiency
    grown = (long[2] - short[2]) * bw
    assert grown == pytest.approx(98_000 * full.kv_bytes_per_token, rel=1e-9)
    assert window.span == 1024
    jamba = RooflineStepModel.build(model_shape("AI21-Jamba-1.5-Mini"), gpu)
    state = next(a for a in jamba.shape.attention if a.kind == "state")
    a, b = ([0.0] * 5 for _ in range(2))
    jamba.time_of(decode_contexts=[10], prefill_chunks=(), ledger=a)
    jamba.time_of(decode_contexts=[10, 10], prefill_chunks=(), ledger=b)
    assert (b[2] - a[2]) * bw >= 2 * state.state_bytes  # read and written per sequence
    scout = RooflineStepModel.build(model_shape("Llama-4-Scout"), gpu)
    c1, c2 = ([0.0] * 5 for _ in range(2))
    scout.time_of(decode_contexts=[8192 + 10], prefill_chunks=(), ledger=c1)
    scout.time_of(decode_contexts=[10], prefill_chunks=(), ledger=c2)
    chunk = next(a for a in scout.shape.attention if a.kind == "chunk")
    full4 = next(a for a in scout.shape.attention if a.kind == "full")
    assert (c1[2] - c2[2]) * bw == pytest.approx(8192 * full4.kv_bytes_per_token, rel=1e-9)
    assert chunk.span == 8192


def _fp8(model: str, tmp_path: Path) -> str:
    from pagedkv import planner

    config, _, name = planner.load_config(model)
    path = tmp_path / f"{name}-FP8.json"
    path.write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    return str(path)


def test_fp8_experts_run_at_the_fused_moe_kernels_shares(tmp_path: Path) -> None:
    """FP8 routed experts on an FP8 GPU stream at moe_fp8_hbm_efficiency and compute at
    moe_fp8_compute_utilization of the FP8 peak; their dense part, BF16 experts and FP8
    experts on a GPU without FP8 math keep the dense constants."""
    h100, a100 = find_gpu("H100"), find_gpu("A100-80GB")
    shape = model_shape(_fp8("Qwen3-235B-A22B-Instruct-2507", tmp_path), tp=4)
    base = CONSTANT_SETS["default"]
    slow = base.with_values({"moe_fp8_hbm_efficiency": base.moe_fp8_hbm_efficiency / 2,
                             "moe_fp8_compute_utilization":
                                 base.moe_fp8_compute_utilization / 2}, name="slow")

    def weights_s(gpu: object, constants: object, contexts: list[int],
                  prefill: list[tuple[int, int]] | None = None) -> list[float]:
        clock = RooflineStepModel.build(shape, gpu, constants)  # type: ignore[arg-type]
        ledger = [0.0] * 5
        clock.time_of(decode_contexts=contexts, prefill_chunks=prefill or (), ledger=ledger)
        return ledger

    one = weights_s(h100, base, [100] * 64)  # 64 decodes: every term weight-bound
    expert_bytes = shape.touched_experts(64) * shape.expert_params
    dense_bytes = shape.dense_params * shape.weight_bytes_per_param
    assert one[0] == pytest.approx(
        dense_bytes / (h100.hbm_bytes_s * base.hbm_efficiency)
        + expert_bytes / (h100.hbm_bytes_s * base.moe_fp8_hbm_efficiency), rel=1e-9)
    halved = weights_s(h100, slow, [100] * 64)
    assert halved[0] - one[0] == pytest.approx(
        expert_bytes / (h100.hbm_bytes_s * base.moe_fp8_hbm_efficiency), rel=1e-9)
    # a long prefill is compute-bound: the experts' FLOPs at the FP8 MoE share
    big = weights_s(h100, base, [], [(0, 16384)])
    big_slow = weights_s(h100, slow, [], [(0, 16384)])
    expert_flops = 2 * shape.top_k * shape.expert_params * 16384
    u_ramp = 16384 / (16384 + base.util_half_tokens)
    assert big_slow[1] - big[1] == pytest.approx(
        expert_flops / (h100.peak_flops(weight_bytes_per_param=1.0)
                        * base.moe_fp8_compute_utilization * u_ramp), rel=1e-6)
    # no FP8 math on an A100 (weight-only FP8): the dense constants, not the MoE ones
    assert weights_s(a100, slow, [100]) == weights_s(a100, base, [100])
    mixtral = RooflineStepModel.build(model_shape("Mixtral-8x7B-Instruct-v0.1", tp=4), h100)
    assert mixtral.time_of(decode_contexts=[100], prefill_chunks=()) == \
        RooflineStepModel.build(mixtral.shape, h100, slow).time_of(
            decode_contexts=[100], prefill_chunks=())


def test_request_latency_default_delays_the_first_token() -> None:
    """The default request latency (docs: the API server's path) is in every TTFT: a lone
    short request's TTFT is that latency plus its one prefill step."""
    from pagedkv.sim.workloads import SimRequest, Workload

    wl = Workload(name="one", requests=(SimRequest(request_id="a", arrival_s=0.0,
                                                   num_prompt_tokens=16,
                                                   num_output_tokens=4),))
    base = with_clock(SimConfig(bounds=False, jobs=1), wl)
    clock = base.scheduler.step_time
    assert isinstance(clock, RooflineStepModel)
    assert clock.request_latency_s == CONSTANT_SETS["default"].request_latency_s > 0
    res = run(wl, base).result
    assert res is not None and res.first_token_s[0] is not None
    step = clock.time_of(decode_contexts=(), prefill_chunks=[(0, 16)])
    assert res.first_token_s[0] - res.arrival_s[0] == pytest.approx(
        clock.request_latency_s + step, rel=1e-6)


def test_prefix_hit_saves_prefill_flops_not_kv_reads() -> None:
    clock = RooflineStepModel.build(model_shape("Llama-3.1-8B"), find_gpu("H100"))
    cold = clock.time_of(decode_contexts=(), prefill_chunks=[(0, 8000)])
    warm = clock.time_of(decode_contexts=(), prefill_chunks=[(7000, 1000)])
    assert warm < cold / 4


def test_tensor_parallel_splits_weights_and_adds_allreduce() -> None:
    gpu = find_gpu("A100-80GB")
    one = RooflineStepModel.build(model_shape("Llama-3.1-70B", tp=4), gpu)
    ledger = [0.0] * 5
    one.time_of(decode_contexts=[1000] * 8, prefill_chunks=(), ledger=ledger)
    assert ledger[4] > 0  # communication
    assert ledger[0] == pytest.approx(
        one.shape.streamed_params * 2 / (gpu.hbm_bytes_s * 0.85), rel=1e-6)


def test_underivable_model_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    with pytest.raises((ConfigError, InputFileError), match=r"hidden_size|size"):
        model_shape(str(p))


# ------------------------------------------------------------------ defaults and linear


def test_roofline_is_the_default_when_the_model_is_known() -> None:
    wl = system_prompts(num_groups=1, questions_per_group=2)
    assert isinstance(with_clock(SimConfig(), wl).scheduler.step_time, RooflineStepModel)
    assert type(with_clock(SimConfig(num_blocks=500), wl).scheduler.step_time) is \
        StepTimeModel
    assert type(with_clock(SimConfig(step_model="linear"), wl).scheduler.step_time) is \
        StepTimeModel
    with pytest.raises(InvalidArgumentError, match="needs the model"):
        with_clock(SimConfig(num_blocks=500, step_model="roofline"), wl)


def test_report_carries_latencies_and_the_clock() -> None:
    rep = run(system_prompts(num_groups=2, questions_per_group=4),
              SimConfig(bounds=False, jobs=1, gpu="A100-80GB")).to_dict()
    lat = rep["latency_s"]
    assert lat["tpot_s"]["p50"] > 0 and lat["e2e_s"]["p99"] >= lat["ttft_s"]["p99"]
    assert rep["output_tokens_per_s"] > 0
    assert rep["clock"]["clock"] == "roofline" and rep["clock"]["gpu"] == "A100-80GB"
    assert rep["clock"]["dominant"] in ("weights", "compute", "KV reads", "overhead")
    assert math.isclose(sum(rep["clock"]["terms_s"].values()), rep["simulated_s"],
                        rel_tol=0.5) or rep["simulated_s"] > 0


# ------------------------------------------------------------------ calibration


def test_calibrate_recovers_known_constants() -> None:
    """Requests replayed with known constants (the request latency included): the fit
    recovers every fitted constant (the per-layer overhead is not fitted)."""
    setup = ReplaySetup(model="Llama-3.1-8B", gpu=find_gpu("H100"))
    truth = CONSTANT_SETS["default"].with_values({
        "hbm_efficiency": 0.72, "compute_utilization": 0.45, "step_overhead_s": 1.5e-3,
        "seq_overhead_s": 60e-6, "request_latency_s": 0.03}, name="truth")
    shapes = [(128, 256, 1), (4096, 32, 1), (16000, 16, 2), (512, 128, 8), (256, 64, 32)]
    data = synthetic_measurements(setup, truth, shapes=shapes)
    fit = fit_constants(data, setup)
    for key in FITTED:
        assert getattr(fit.constants, key) == pytest.approx(getattr(truth, key), rel=0.01), key
    assert fit.error_before > 0.05 and fit.error_after < 1e-4


def test_calibrate_closes_a_ttft_gap_with_the_request_latency() -> None:
    """An aggregate-only result whose TTFT the steps cannot explain (an API server's
    path): the fit puts the gap in the request latency, not in the GPU constants."""
    setup = ReplaySetup(model="Qwen3-8B", gpu=find_gpu("H100"))
    data = [Measured(input_tokens=233, output_tokens=221, concurrency=4, count=12,
                     ttft_s=0.064, tpot_s=0.00738)]
    fit = fit_constants(data, setup)
    assert fit.error_before > 0.4 and fit.error_after < 0.05
    assert 0.03 < fit.constants.request_latency_s < 0.07


_DATA = Path(__file__).parent / "data"


def _fp8_70b(tmp_path: Path) -> str:
    from pagedkv import planner

    config, _, _ = planner.load_config("Llama-3.1-70B")
    path = tmp_path / "Llama-3.1-70B-FP8.json"
    path.write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    return str(path)


@pytest.mark.parametrize(("name", "gpu", "tp", "before", "after"), [
    ("lambda_70b_fp8_tp4_h100.json", "H100", 4, (0.25, 0.40), 0.12),
    ("lambda_70b_fp8_tp2_a100.json", "A100-80GB", 2, (0.0, 0.10), 0.05)])
def test_calibrate_on_published_per_request_data(tmp_path: Path, name: str, gpu: str, tp: int,
                                                 before: tuple[float, float],
                                                 after: float) -> None:
    """Real per-request measurements (tests/sim/data/SOURCE.md: Llama-3.1-70B FP8 on
    4x H100 and 2x A100, vLLM 0.6, tokens streamed ten to a chunk): the zero-fit error,
    and the error after --calibrate on the same file."""
    setup = ReplaySetup(model=_fp8_70b(tmp_path), gpu=find_gpu(gpu), tp=tp)
    data = load_measured(_DATA / name)
    assert len(data) == 8  # two of the ten requests returned nothing
    fit = fit_constants(data, setup)
    assert before[0] <= fit.error_before <= before[1]
    assert fit.error_after <= after


def _bench_file(path: Path, data: list[object]) -> None:
    rows = [m for m in data if hasattr(m, "ttft_s")]
    by_conc: dict[int, list[object]] = {}
    for m in rows:
        by_conc.setdefault(m.concurrency, []).append(m)  # type: ignore[attr-defined]
    for c, ms in by_conc.items():
        (path / f"bench_c{c}.json").write_text(json.dumps({
            "max_concurrency": c, "input_lens": [m.input_tokens for m in ms],  # type: ignore[attr-defined]
            "output_lens": [m.output_tokens for m in ms],  # type: ignore[attr-defined]
            "ttfts": [m.ttft_s for m in ms],  # type: ignore[attr-defined]
            "itls": [[m.tpot_s] * (m.output_tokens - 1) for m in ms]}))  # type: ignore[attr-defined]


def test_calibrate_cli_round_trip(tmp_path: Path) -> None:
    """Files in `vllm bench serve` form, generated with known constants: --calibrate
    writes them back, and --calibration FILE loads them."""
    setup = ReplaySetup(model="Llama-3.1-8B", gpu=find_gpu("A100-80GB"))
    truth = CONSTANT_SETS["default"].with_values({"hbm_efficiency": 0.7,
                                                  "step_overhead_s": 2e-3}, name="t")
    # a long prompt's chunked prefill tells the per-step overhead from the bandwidth
    shapes = [(128, 256, 1), (4096, 32, 1), (16000, 16, 2), (512, 128, 8), (256, 64, 32)]
    data = synthetic_measurements(setup, truth, shapes=shapes)
    _bench_file(tmp_path, list(data))
    files = sorted(str(p) for p in tmp_path.glob("bench_c*.json"))
    assert sum(len(load_measured(f)) for f in files) == len(data)
    out = tmp_path / "cal.json"
    proc = subprocess.run([sys.executable, "-m", "pagedkv", "simulate", "--gpu", "A100-80GB",
                           "--calibrate", *files, "--save-calibration", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "mean absolute error" in proc.stdout and "-> 0.0 % fitted" in proc.stdout
    loaded = load_constants(str(out))
    assert loaded.hbm_efficiency == pytest.approx(0.7, rel=0.01)
    assert loaded.step_overhead_s == pytest.approx(2e-3, rel=0.01)


# ------------------------------------------------------------------ validation points


@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
def test_published_point(point: object) -> None:
    """Each published measurement is met within its tolerance, or is a recorded miss
    (docs/simulator.md keeps it in the table with its error) that must not drift."""
    assert isinstance(point, Point)
    sim = _simulated(point)
    err = (sim - point.measured) / point.measured
    recorded = MISSES.get(point.name)
    if recorded is None:
        assert abs(err) <= point.tolerance, f"{point.name}: {100 * err:+.1f} %"
    else:
        assert err == pytest.approx(recorded, abs=0.02), f"{point.name}: {100 * err:+.1f} %"


_SIMULATED: dict[str, float] = {}


def _simulated(point: Point) -> float:
    """``simulate_point(point)``, once per test session (the docs' table reuses it)."""
    if point.name not in _SIMULATED:
        _SIMULATED[point.name] = simulate_point(point)
    return _SIMULATED[point.name]


def _table_rows() -> list[list[str]]:
    """docs/simulator.md's validation table: one list of cells per point row."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text(
        encoding="utf-8")
    head = text.index("| point | source | measured | zero-fit |")
    rows = []
    for line in text[head:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def _number(cell: str) -> float:
    return float(cell.replace("*", "").replace("(miss)", "").replace("%", "")
                 .replace("−", "-").replace(",", "").strip())


def test_validation_table_in_the_docs_is_current() -> None:
    """Every zero-fit figure and error docs/simulator.md's validation table shows is what
    the replay gives now (to the digits shown), and so are the mean errors under it."""
    rows = _table_rows()
    assert len(rows) == len(POINTS)
    errors = []
    for row, point in zip(rows, POINTS, strict=True):
        sim = _simulated(point)
        err = 100 * (sim - point.measured) / point.measured
        errors.append(abs(err))
        shown, shown_err = _number(row[3]), _number(row[4])
        digits = len(row[3].split(".")[1]) if "." in row[3] else 0
        assert abs(shown - sim) <= 0.51 * 10 ** -digits, (point.name, shown, sim)
        assert abs(shown_err - err) <= 0.051, (point.name, shown_err, err)
        assert "miss" in row[4] if point.name in MISSES else "miss" not in row[4]
    ttft = [e for e, p in zip(errors, POINTS, strict=True) if p.metric == "ttft_ms"]
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "simulator.md")
                    .read_text(encoding="utf-8").split())
    assert (f"Mean absolute error: {sum(errors) / len(errors):.1f} % over the "
            f"{len(POINTS)} points with the zero-fit defaults") in text
    assert f"over the TTFT points: {sum(ttft) / len(ttft):.1f} %" in text
    moe = [e for e, p in zip(errors, POINTS, strict=True)
           if "Mixtral" in p.name or "A22B" in p.name]
    dense = [e for e, p in zip(errors, POINTS, strict=True) if p.metric != "ttft_ms"
             and "Mixtral" not in p.name and "A22B" not in p.name]
    assert f"dense models: {sum(dense) / len(dense):.1f} %" in text
    assert f"over the two MoEs (five points): {sum(moe) / len(moe):.1f} %" in text


#: Points the zero-fit clock misses (docs/simulator.md, "Validation"): relative error.
MISSES = {
    "Llama-3.1-8B FP8 offline H100 / L40S throughput": -0.224,
    "Mistral-7B RTX 4090 c=16 mean TTFT": -0.285,
    "Qwen3-8B H100 ShareGPT c=4 mean TTFT": -0.680,
    "Llama-3.1-70B FP8 TP4 H100 median TPOT": -0.323,
}


def test_measured_tpot_counts_tokens_not_chunks(tmp_path: Path) -> None:
    """A server that streams 10 tokens a chunk (multi-step scheduling) reports one gap
    per chunk: TPOT is the gaps' sum over output_len - 1, not their mean; and a run at
    request rate "inf" without max_concurrency had every request in flight at once."""
    f = tmp_path / "chunked.json"
    f.write_text(json.dumps({"request_rate": "inf", "input_lens": [10, 20, 30],
                             "output_lens": [41, 0, 6], "ttfts": [0.1, 0.0, 0.1],
                             "itls": [[0.1, 0.1, 0.1, 0.1], [], [0.1]]}))
    m, short = load_measured(f)
    assert m.tpot_s == pytest.approx(0.4 / 40)
    assert m.concurrency == 2  # the failed request (ttft 0) never ran
    assert short.tpot_s is None  # one chunk: its tokens' split is unknown
    assert m.ttft_s == 0.0  # the first chunk's time, not the first token's: not used


def test_a100_ratio_in_the_issue_range() -> None:
    point = next(p for p in POINTS if "c=8 / c=1" in p.name)
    assert 5.5 <= simulate_point(point) <= 7.5


# ------------------------------------------------------------------ CLI


def _simulate(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pagedkv", "simulate", "--no-progress",
                           "--no-plots", "--no-bounds", *argv], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_70b_a100_and_h100_differ_and_say_why() -> None:
    out = {}
    for gpu in ("A100-80GB", "H100"):
        proc = _simulate("--model", "Llama-3.1-70B", "--gpu", gpu, "--tp", "4", "--limit",
                         "40", "--json")
        assert proc.returncode == 0, proc.stderr
        out[gpu] = json.loads(proc.stdout)
    a, h = out["A100-80GB"], out["H100"]
    # docs/simulator.md ("A 70B on A100 vs H100") shows these figures of these runs
    lat = [(r["latency_s"]["ttft_s"]["p50"], 1e3 * r["latency_s"]["tpot_s"]["p50"],
            r["output_tokens_per_s"], 1e3 * r["clock"]["decode_step_s"]) for r in (a, h)]
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "simulator.md")
                   .read_text(encoding="utf-8").split())
    assert (f"TTFT p50 {lat[0][0]:.1f} s vs {lat[1][0]:.1f} s, TPOT p50 {lat[0][1]:.0f} ms "
            f"vs {lat[1][1]:.0f} ms, {lat[0][2]:.0f} vs {lat[1][2]:.0f} output tokens/s"
            ) in doc
    assert f"a decode step of {lat[0][3]:.1f} / {lat[1][3]:.1f} ms" in doc
    assert a["clock"]["dominant"] == h["clock"]["dominant"] == "compute"
    assert h["latency_s"]["ttft_s"]["p50"] < a["latency_s"]["ttft_s"]["p50"]
    assert h["latency_s"]["tpot_s"]["p50"] < a["latency_s"]["tpot_s"]["p50"]
    for rep, name in ((a, "A100-80GB"), (h, "H100-SXM")):
        assert f"TP 4 on {name}" in rep["clock"]["description"]
        assert rep["clock"]["dominant"] in ("weights", "compute", "KV reads", "overhead")
    text = _simulate("--model", "Llama-3.1-70B", "--gpu", "A100-80GB", "--tp", "4",
                     "--limit", "40")
    line = next(x for x in text.stdout.splitlines() if x.startswith("clock: roofline"))
    assert "Llama-3.1-70B TP 4 on A100-80GB" in line


BAD = [
    ("unknown gpu", ["--gpu", "V100"], "unknown GPU 'V100'"),
    ("nan calibration", ["--calibration", "{nan}"], "hbm_efficiency"),
    ("negative calibration", ["--calibration", "{neg}"], "must be a number in (0, 1]"),
    ("unknown calibration", ["--calibration", "fastest"], "no such constant set or file"),
    ("negative gpu spec", ["--gpu", "{badgpu}"], "finite number > 0"),
    ("measured without fields", ["--calibrate", "{nofields}"], "'completed': missing"),
    ("measured nan", ["--calibrate", "{nanbench}"], "finite number"),
    ("underivable model", ["--model", "{badmodel}"], "hidden_size"),
    ("gpu with num-blocks", ["--gpu", "H100", "--num-blocks", "100"], "either --num-blocks"),
    ("roofline with num-blocks", ["--step-model", "roofline", "--num-blocks", "100"],
     "needs the model"),
    ("linear flag with roofline", ["--step-model", "roofline", "--decode-seq-us", "5"],
     "set the linear model"),
]


#: The caller's mistakes among :data:`BAD` (exit 2); the rest cannot be run (exit 1).
CALLER_MISTAKES = {"unknown gpu", "unknown calibration", "gpu with num-blocks",
                   "roofline with num-blocks", "linear flag with roofline"}


@pytest.mark.parametrize(("name", "argv", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_clock_input_is_one_line_exit_1_nothing_written(
        tmp_path: Path, name: str, argv: list[str], words: str) -> None:
    files = {
        # NaN is read (Python's json writes it); the field that needs a number refuses it
        "nan": json.dumps({k: math.nan if k == "hbm_efficiency" else 0.5 for k in FITTED}),
        "neg": json.dumps({k: -1 for k in FITTED}),  # every fitted key, all negative
        "badgpu": json.dumps({"bf16_tflops": -1, "hbm_tb_s": 1, "memory_gib": 8}),
        "nofields": json.dumps({"max_concurrency": 1}),
        "nanbench": json.dumps({"completed": 1, "input_lens": [10], "output_lens": [5],
                                "ttfts": [math.nan], "itls": [[0.01] * 4]}),
        "badmodel": json.dumps({"model_type": "llama", "num_hidden_layers": 2,
                                "num_attention_heads": 4, "vocab_size": 10}),
    }
    paths = {}
    for key, text in files.items():
        p = tmp_path / f"{key}.json"
        p.write_text(text)
        paths[key] = str(p)
    work = tmp_path / "work"
    work.mkdir()
    proc = _simulate("--limit", "5", *[a.format(**paths) for a in argv], cwd=work)
    assert proc.returncode == (2 if name in CALLER_MISTAKES else 1), (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert words in lines[0], lines[0]
    assert not any(work.iterdir())  # nothing written (no calibration file, no plots)


def test_eos_lengths_keep_the_published_mean_under_the_cap() -> None:
    """Answers that stop at EOS or at the cap: the mean asked for, none over the cap, the
    same lengths on every call; a run with such lengths starts its streams together, as
    ``vllm bench serve --max-concurrency`` does."""
    from pagedkv.sim.clock.validation import Run, closed_loop, eos_lengths

    lengths = eos_lengths(256, 128, 100.5, 300)
    outs = [o for _, o in lengths]
    assert sum(outs) / len(outs) == pytest.approx(100.5, rel=0.02)
    assert max(outs) == 128 and min(outs) >= 1 and len(set(outs)) > 20
    assert lengths == eos_lengths(256, 128, 100.5, 300)
    assert all(i == 256 for i, _ in lengths)
    run = Run(model="Mistral-7B-v0.1", gpu="H100-SXM", input_tokens=256, output_tokens=128,
              lengths=lengths, concurrency=4, num_requests=12)
    wl = closed_loop(run)
    assert [r.arrival_s for r in wl.requests[:4]] == [0.0] * 4
    assert [r.parent for r in wl.requests[4:8]] == [0, 1, 2, 3]
