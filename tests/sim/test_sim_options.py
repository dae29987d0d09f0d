"""``pagedkv simulate``'s option table (:mod:`pagedkv.sim.options`) and the library side of
its rules (:mod:`pagedkv.sim.setup`): one table builds the parser; one option's text
converts as the command line converts it; the parsed values become a run."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import pytest

from pagedkv.errors import InvalidArgumentError
from pagedkv.sim import SimConfig
from pagedkv.sim.options import GROUPS, OPTIONS, add_simulate_options, parse_option_value
from pagedkv.sim.scheduler import SchedulerConfig
from pagedkv.sim.setup import (
    DEFAULT_SWEEP_TOKENS,
    CalibrateRequest,
    SimulateRequest,
    simulate_request,
    sweep_capacities,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "pagedkv"

#: option -> (texts the command line accepts, texts it refuses)
SAMPLES: dict[str, tuple[list[str], list[str]]] = {
    "--trace": (["a.jsonl"], []),
    "--generator": (["agent", "multi-turn"], ["nope"]),
    "--trace-format": (["auto"], ["xml"]),
    "--session-stagger-s": (["0", "1.5"], ["nan", "-1", "inf", "x"]),
    "--trace-block-size": (["1", "512"], ["0", "1.5", "99999999999"]),
    "--limit": (["3", "-1"], ["x", "1.5"]),
    "--groups": (["2"], ["two"]),
    "--interval-s": (["0.5"], ["nan"]),
    "--block-size": (["16"], ["16.0", ""]),
    "--gpu-memory-utilization": (["0.5", "1"], ["0", "1.1", "nan"]),
    "--semantics": (["reference"], ["exact"]),
    "--mode": (["pure-cache"], ["fast"]),
    "--rate-scale": (["2"], ["0", "1e7"]),
    "--step-model": (["linear"], ["cubic"]),
    "--step-overhead-ms": (["0", "3.5"], ["-1"]),
    "--capacity-sweep": (["1e6,unlimited"], []),
    "--warmup-fraction": (["0", "0.5"], ["1", "-0.1"]),
    "--retention": (["pin-popular"], ["mru"]),
    "--kv-events-form": (["array"], ["list"]),
    "--replicas": (["4"], ["0", "5000"]),
    "--router": (["cache-aware"], ["random"]),
    "--ghost-entries": (["10"], ["1e3"]),
    "--metrics-linger-s": (["2"], ["-2"]),
    "--host-memory": (["1GiB,2GiB"], ["lots", "-1GiB"]),
    "--host-bandwidth-gbps": (["25"], ["0"]),
    "--host-write-policy": (["write-through"], ["never"]),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simulate")
    add_simulate_options(p)
    return p


def _cli_error(flag: str, text: str) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        _parser().parse_args([f"{flag}={text}"])
    assert exc.value.code == 2
    return err.getvalue().strip().splitlines()[-1].split("error: ", 1)[1]


def test_the_table_is_consistent() -> None:
    flags = [o.flag for o in OPTIONS]
    dests = [o.dest for o in OPTIONS]
    assert len(set(flags)) == len(flags) and len(set(dests)) == len(dests)
    assert {o.group for o in OPTIONS} == set(GROUPS)
    parsed = vars(_parser().parse_args([]))
    assert parsed == {o.dest: o.default for o in OPTIONS}


def test_no_other_simulator_module_declares_an_option() -> None:
    declaring = sorted(str(p.relative_to(SRC)) for p in (SRC / "sim").rglob("*.py")
                       if "add_argument(" in p.read_text())
    assert declaring == ["sim/options.py"]


@pytest.mark.parametrize("flag", sorted(SAMPLES))
def test_one_value_converts_as_the_command_line_converts_it(flag: str) -> None:
    good, bad = SAMPLES[flag]
    dest = flag[2:].replace("-", "_")
    for text in good:
        expected = getattr(_parser().parse_args([f"{flag}={text}"]), dest)
        assert parse_option_value(flag, text) == expected
        assert parse_option_value(dest, text) == expected
    for text in bad:
        with pytest.raises(InvalidArgumentError) as exc:
            parse_option_value(flag, text)
        assert str(exc.value) == _cli_error(flag, text)


def test_switches_lists_and_unknown_names() -> None:
    assert parse_option_value("--json", "true") is True
    assert parse_option_value("no_plots", "off") is False
    assert parse_option_value("--calibrate", "a.json, b.json") == ["a.json", "b.json"]
    with pytest.raises(InvalidArgumentError, match="--json: a switch takes true or false"):
        parse_option_value("--json", "maybe")
    with pytest.raises(InvalidArgumentError, match="'--colour' is not a simulate option"):
        parse_option_value("--colour", "red")
    with pytest.raises(InvalidArgumentError, match="must be text"):
        parse_option_value("--block-size", 16)  # type: ignore[arg-type]


def test_no_values_ask_for_the_default_run() -> None:
    req = simulate_request({})
    assert isinstance(req, SimulateRequest)
    # the engine refuses what the default model cannot take: its context, 131,072 tokens
    assert req.config == SimConfig(scheduler=SchedulerConfig(max_model_len=131072))
    assert req.workload.trace is None and req.workload.generator is None
    assert req.output.plot_dir == "pagedkv-report" and req.output.progress
    assert req.observe is None and req.replicas is None and req.ttft_p99_target_s is None


def test_values_become_the_run() -> None:
    req = simulate_request({
        "generator": "agent", "sessions": 3, "think_s": 0.5, "num_blocks": 900,
        "step_overhead_ms": 2.0, "capacity_sweep": "1e4,unlimited", "find_capacity": True,
        "ttft_p99": "500ms", "no_plots": True, "explain_misses": True,
        "host_memory": None, "retention": "lru"})
    assert isinstance(req, SimulateRequest)
    c = req.config
    assert (c.num_blocks, c.step_model, c.capacity_sweep, c.retention) == (
        900, "linear", (10_000, None), "lru")
    assert c.scheduler.step_time.step_overhead_s == pytest.approx(2e-3)
    assert req.workload.params == {"num_agents": 3, "think_s": 0.5}
    assert req.ttft_p99_target_s == pytest.approx(0.5)
    assert req.output.plot_dir is None
    assert req.observe is not None and req.observe.explain_misses
    wl, what = req.workload.load()
    assert len(wl.requests) > 0 and what.startswith("generator agent: ")


def test_calibrate_values_become_a_calibration() -> None:
    req = simulate_request({"calibrate": ["m.json"], "model": "Llama-3.1-8B", "tp": 2})
    assert req == CalibrateRequest(measured=("m.json",), save_to="pagedkv-calibration.json",
                                   model="Llama-3.1-8B", tp=2)


@pytest.mark.parametrize(("values", "message"), [
    ({"limit": 0}, "--limit must be >= 1, got 0"),
    ({"groups": 2}, "--groups is a generator parameter; add --generator"),
    ({"generator": "agent", "groups": 2}, "--groups does not apply to --generator agent"),
    ({"generator": "agent", "trace": "a.jsonl"}, "--trace and --generator are alternatives"),
    ({"router": "round-robin"}, "--router needs --replicas N"),
    ({"replicas": 2, "find_capacity": True}, "--find-capacity does not apply to --replicas"),
    ({"metrics_linger_s": 1.0}, "--metrics-linger-s goes with --metrics-port"),
    ({"explain_misses": True, "mode": "pure-cache"}, "--explain-misses observes the "
     "simulated engine"),
    ({"host_write_policy": "write-through"}, "--host-write-policy needs --host-memory"),
    ({"decode_seq_us": 1.0, "step_model": "roofline"}, "set the linear model"),
    ({"find_capacity": True, "mode": "pure-cache"}, "--find-capacity needs --mode engine"),
    ({"capacity_sweep": "lots"}, "--capacity-sweep: 'lots' is not a token count"),
    ({"colour": "red"}, "'colour' is not a simulate option"),
    ({"block_size": "16"}, "argument --block-size: takes a number, got '16'"),
    ({"block_size": 16.5}, "argument --block-size: invalid int value: '16.5'"),
    ({"limit": True}, "argument --limit: takes a number, got True"),
    ({"rate_scale": float("nan")}, "argument --rate-scale: must be a finite number"),
    ({"mode": 3}, "argument --mode: takes text, got 3"),
    ({"mode": "fast"}, "argument --mode: invalid choice: 'fast'"),
    ({"json": 1}, "argument --json: takes true or false, got 1"),
    ({"calibrate": "m.json"}, "argument --calibrate: takes a list of texts"),
    ({"host_memory": [b"1GiB"]}, "argument --host-memory: takes a tuple of byte counts"),
    ({"block_size": None}, "argument --block-size: takes a number, got None"),
])
def test_rules_refuse_by_name(values: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        simulate_request(values)


def test_sweep_capacities() -> None:
    assert sweep_capacities("default") == DEFAULT_SWEEP_TOKENS
    assert sweep_capacities("1e5, 3e6 ,none") == (100_000, 3_000_000, None)
    with pytest.raises(InvalidArgumentError, match="'1e999' is not a token count"):
        sweep_capacities("1e999")


