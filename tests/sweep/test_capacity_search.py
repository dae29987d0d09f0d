"""The capacity search's whole space: after GPU x TP x replicas it widens the router and
the KV memory of the misses just below its answer, on the backend it is given, and a
widened variant that meets becomes the (cheaper) answer; the printed command replays it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pagedkv.sim import system_prompts
from pagedkv.sim.search import reproducing_args
from pagedkv.sweep.backends import Outcome
from pagedkv.sweep.capacity import (
    ROUTER,
    WIDE_KV_FRACTION,
    WIDE_ROUTER,
    Deployment,
    find_deployment,
)
from pagedkv.sweep.rows import Slo

SLO = Slo(ttft_p99_s=2.0, tpot_p99_ms=100.0)


class RuleBackend:
    """A backend whose figures follow ``meets(options)``; it records each batch."""

    name = "rule"
    workers = 2

    def __init__(self, meets: Any) -> None:
        self.meets = meets
        self.batches: list[list[Mapping[str, Any]]] = []

    def run(self, workload: Any, tasks: Sequence[tuple[int, Mapping[str, Any]]]
            ) -> Iterator[Outcome]:
        self.batches.append([o for _, o in tasks])
        for index, options in tasks:
            ok = self.meets(options)
            yield Outcome(index, {"ttft_p99_s": 1.0 if ok else 9.0, "tpot_p99_s": 0.01,
                                  "rejected": 0, "preemptions": 0 if ok else 5,
                                  "stopped_early": None}, None, 0.1)


def _wl() -> Any:  # token-id prompts that share prefixes (no prefill floor: replays decide)
    return system_prompts(num_groups=2, questions_per_group=4)


def test_a_router_that_meets_with_fewer_replicas_becomes_the_answer() -> None:
    backend = RuleBackend(lambda o: o["replicas"] >= 4 or (
        o["replicas"] >= 3 and o["router"] == WIDE_ROUTER))
    answer = find_deployment(_wl(), {}, SLO, prices={"H100-SXM": 2.0}, backend=backend,
                             max_replicas=8)
    assert answer.best is not None
    d = answer.best.deployment
    assert (d.replicas, d.tp, d.router, d.kv_fraction) == (3, 1, WIDE_ROUTER, None)
    # the widened candidates went to the backend as one batch (its workers run them at once)
    assert max(len(b) for b in backend.batches) > 1
    nxt = answer.next_cheaper
    assert nxt is not None and not nxt.meets and nxt.deployment < d
    text = "\n".join(answer.lines(["--limit", "10"]))
    assert "3 x H100-SXM cache-aware ($6.00/h)" in text
    assert "--replicas 3 --router cache-aware" in text


def test_more_kv_memory_is_tried_where_the_miss_preempted() -> None:
    backend = RuleBackend(lambda o: o["replicas"] >= 2 or
                          o.get("gpu_memory_utilization") == WIDE_KV_FRACTION)
    answer = find_deployment(_wl(), {}, SLO, prices={"H100-SXM": 2.0}, backend=backend,
                             max_replicas=4)
    assert answer.best is not None
    d = answer.best.deployment
    assert (d.replicas, d.kv_fraction, d.router) == (1, WIDE_KV_FRACTION, ROUTER)
    assert d.flags()[-2:] == ["--gpu-memory-utilization", "0.95"]
    assert "KV at 0.95 of GPU memory" in d.describe()


def test_nothing_is_widened_where_it_cannot_change_the_answer() -> None:
    # the run's own KV fraction already at the widened one, one replica (router moot)
    backend = RuleBackend(lambda o: True)
    answer = find_deployment(_wl(), {"gpu_memory_utilization": WIDE_KV_FRACTION}, SLO,
                             prices={"H100-SXM": 2.0}, backend=backend)
    assert answer.best is not None and answer.best.deployment.replicas == 1
    assert len(answer.tried) == 1  # cheapest first, stop at the first that meets


def test_deployment_order_puts_the_runs_own_settings_first() -> None:
    own = Deployment(4.0, 2, 1, "H100-SXM")
    wide = Deployment(4.0, 2, 1, "H100-SXM", widened=1, router=WIDE_ROUTER)
    assert own < wide < Deployment(4.01, 1, 1, "B200")


def test_reproducing_args_drop_the_ray_flag_with_or_without_its_value() -> None:
    assert reproducing_args(["--ray", "--limit", "5"]) == ["--limit", "5", "--no-bounds"]
    assert reproducing_args(["--ray", "auto", "--limit", "5"]) == ["--limit", "5",
                                                                   "--no-bounds"]
    assert reproducing_args(["--ray=auto"]) == ["--no-bounds"]
