"""--find-capacity: the deployment it names, replayed alone, meets the SLO and the
next-cheaper one it replayed does not; every verdict's advice is a command that runs and
answers; durations parse; the reproducing command keeps the workload's flags."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from pagedkv import InvalidArgumentError
from pagedkv.sim import system_prompts
from pagedkv.sim.search import parse_seconds, reproducing_args
from pagedkv.sim.summary import FIND_CAPACITY_ADVICE, SEARCHED_ADVICE
from pagedkv.sweep.capacity import Deployment, alone_ttft_p99_s, find_deployment
from pagedkv.sweep.point import run_point
from pagedkv.sweep.rows import Slo

#: The bundled default's first 300 requests (saturated on one H100, as the whole trace).
HEAD = ["--limit", "300"]


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pagedkv", "simulate", *args],
                          capture_output=True, text=True, timeout=300, check=False,
                          stdin=subprocess.DEVNULL)


def _run_command(line: str) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line)
    assert argv[:2] == ["pagedkv", "simulate"], line
    return _sim(*argv[2:])


def test_the_named_deployment_meets_the_slo_and_the_next_cheaper_does_not() -> None:
    # The bundled default's verdict (saturated) names the deployment without being asked.
    p = _sim(*HEAD, "--no-plots", "--no-bounds", "--json")
    assert p.returncode == 0, p.stderr
    found = json.loads(p.stdout)["find_capacity"]
    best, cheaper = found["best"], found["next_cheaper"]
    assert best is not None and best["meets_slo"] and cheaper is not None
    assert cheaper["usd_per_hour"] < best["usd_per_hour"] and not cheaper["meets_slo"]
    slo = found["slo"]
    # The command it prints replays that deployment alone: the SLO is met.
    alone = _run_command(found["command"] + " --json --no-plots --no-progress")
    assert alone.returncode == 0, alone.stderr
    (row,) = json.loads(alone.stdout)["results"]
    assert row["ttft"]["p99"] <= slo["ttft_p99_s"]
    assert row["tpot"]["p99"] * 1e3 <= slo["tpot_p99_ms"] and row["num_rejected"] == 0
    assert row["ttft"]["p99"] == best["metrics"]["ttft_p99_s"]
    # The next-cheaper one, replayed to the end, misses it.
    opts = {"limit": 300, "gpu": cheaper["gpu"], "tp": cheaper["tp"],
            "replicas": cheaper["replicas"], "router": cheaper["router"]}
    if cheaper["kv_fraction"] is not None:
        opts["gpu_memory_utilization"] = cheaper["kv_fraction"]
    assert not Slo(ttft_p99_s=slo["ttft_p99_s"], tpot_p99_ms=slo["tpot_p99_ms"]).met(
        run_point(_head(), opts))


def _head():
    from pagedkv.sim import bundled_trace_path, load_trace

    return load_trace(bundled_trace_path(), limit=300)


@pytest.mark.parametrize(("args", "limit"), [
    (HEAD, "The KV cache is the limit"),
    (["--generator", "agent", "--num-blocks", "20000", "--arrivals", "at-once",
      "--max-running", "4"],
     "Compute is the limit"),
    (["--generator", "system-prompts", "--groups", "2", "--per-group", "4"],
     "A smaller deployment may do"),
])
def test_every_advice_is_a_command_that_answers(args: list[str], limit: str) -> None:
    p = _sim(*args, "--no-plots", "--no-bounds", "--no-progress")
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    # the bundled default searches by itself: its verdict points to the answer below it,
    # not to a command still to run
    searched = "cheapest deployment meeting" in text or "no deployment meets" in text
    assert searched == (args == HEAD)
    advice = SEARCHED_ADVICE if searched else FIND_CAPACITY_ADVICE
    assert limit in text and advice in text
    assert (FIND_CAPACITY_ADVICE in text) != searched
    if searched:
        assert text.index(advice) < text.index("find capacity (")
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("next: ")]
    answer = _run_command(line.removeprefix("next: ") + " --no-progress")
    assert answer.returncode == 0, answer.stderr
    assert "cheapest deployment meeting" in answer.stdout or \
        "no deployment meets" in answer.stdout


def test_a_search_without_answer_says_why() -> None:
    wl = _head()
    answer = find_deployment(wl, {}, Slo(ttft_p99_s=1e-6, tpot_p99_ms=1e-3),
                             prices={"H100-SXM": 2.99}, max_replicas=2)
    assert answer.best is None and answer.tried == ()  # no replay was needed
    (line,) = answer.lines([])
    assert "prefill alone gives a TTFT p99 of at least" in line
    floor = alone_ttft_p99_s(wl, {"gpu": "H100-SXM"})
    assert floor is not None and floor > 0
    # token-id prompts have no hashes to bound with: the replays decide
    tokens = system_prompts(num_groups=2, questions_per_group=4)
    assert alone_ttft_p99_s(tokens, {"gpu": "H100-SXM"}) is None
    answer = find_deployment(tokens, {}, Slo(ttft_p99_s=1e-6, tpot_p99_ms=1e-3),
                             prices={"H100-SXM": 2.99}, max_replicas=2)
    assert answer.best is None
    searched = [t.deployment for t in answer.tried if not t.deployment.widened]
    widened = [t.deployment for t in answer.tried if t.deployment.widened]
    assert len(searched) == 3 * 2  # 3 TP sizes x 1 and 2 replicas
    # then each pair's costliest miss once more with the cache-aware router (the prompts
    # share prefixes); no KV variant: nothing was preempted
    assert sorted((d.tp, d.replicas, d.router) for d in widened) == [
        (tp, 2, "cache-aware") for tp in (1, 2, 4)]
    assert "none of 3 TP sizes" in answer.lines([])[0]


def test_deployments_order_by_cost() -> None:
    cheap, dear = Deployment(2.5, 1, 1, "L40S"), Deployment(2.99, 1, 1, "H100-SXM")
    assert cheap < dear and dear.describe() == "1 x H100-SXM ($2.99/h)"
    assert dear.flags() == ["--gpu", "H100-SXM", "--tp", "1", "--replicas", "1",
                            "--router", "least-loaded"]


def test_reproducing_args_keep_the_workload_only() -> None:
    argv = ["--limit", "300", "--gpu", "B200", "--find-capacity", "--ttft-p99", "1s",
            "--json", "--replicas=2", "--trace", "t.jsonl"]
    assert reproducing_args(argv) == ["--limit", "300", "--trace", "t.jsonl", "--no-bounds"]


@pytest.mark.parametrize(("text", "seconds"), [("2s", 2.0), ("500ms", 0.5), ("1.5", 1.5)])
def test_parse_seconds(text: str, seconds: float) -> None:
    assert parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0s", "-1", "soon", "inf"])
def test_parse_seconds_rejects(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="positive duration"):
        parse_seconds(text)
