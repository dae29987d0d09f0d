#!/usr/bin/env python3
"""What an argument record into ``Coordinator.allocate`` would cost, on the harness.

Today the façade calls ``coordinator.allocate`` with nine positionals (keywords were
measured at ~3 % of an allocation). This script puts one extra hop between the façade
and the coordinator's method, in four forms, on four managers built as the harness's
pagedkv adapter builds them (``kv_workload.py``, ``vllm_compare_adapter.py``):

* ``positional``: the hop passes the nine values on positionally (today's cost, plus a hop);
* ``record``: the hop builds a small slotted record (``AllocateArgs``) and a second
  function reads its nine fields back before calling the method (what a record costs:
  building it and reading it, against passing the values);
* ``namedtuple``: the same with a NamedTuple built from a tuple (``tuple.__new__``);
* ``keywords``: the hop passes the eight after the request id as keywords (the old
  figure, for scale).

The same hop count on every side, so the differences are the record's (or the keywords')
cost. First, each hop alone in front of a no-op method of the same signature (the
minimum over repeats of ``timeit``: nanoseconds per call, the noise of a shared machine
mostly gone). Then the four managers replay the harness workload in lockstep
(``lockstep.py``: one operation at a time on every manager, the first side rotating, so
a slow moment of a shared machine falls on all alike; their block ids must agree).
Prints, per round and as the median over rounds, the seconds in lookup / allocate / free
per form and its change against ``positional``. On the compiled core a request's allocation reaches
``Coordinator.allocate`` only when the C entry does not take it (``ccore_fast.h``,
``ccore_admit.h``); ``PAGEDKV_PURE=1`` shows the cost where every allocation passes
through it. The cyclic garbage collector is paused during each replay (its pauses would
fall on whichever side runs).

    python benchmarks/ab_allocate_args.py [--preset new-request-heavy] [--rounds 3]
    PAGEDKV_PURE=1 python benchmarks/ab_allocate_args.py --preset shared-prompt
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import timeit
from collections.abc import Callable
from typing import Any, NamedTuple

import kv_workload
from lockstep import replay_lockstep
from vllm_compare_adapter import PagedKVAdapter

from pagedkv.core import native


class AllocateArgs:
    """``Coordinator.allocate``'s nine arguments as one record (this measurement only)."""

    __slots__ = (
        "headroom_blocks",
        "hit",
        "num_computed_tokens",
        "num_encoder_tokens",
        "num_local_computed_tokens",
        "num_tokens",
        "num_tokens_main_model",
        "request_id",
        "total_computed_tokens",
    )

    def __init__(self, request_id: str, hit: Any, num_computed_tokens: int,
                 total_computed_tokens: int, num_tokens: int, num_encoder_tokens: int,
                 num_tokens_main_model: int | None, headroom_blocks: int,
                 num_local_computed_tokens: int | None) -> None:
        self.request_id = request_id
        self.hit = hit
        self.num_computed_tokens = num_computed_tokens
        self.total_computed_tokens = total_computed_tokens
        self.num_tokens = num_tokens
        self.num_encoder_tokens = num_encoder_tokens
        self.num_tokens_main_model = num_tokens_main_model
        self.headroom_blocks = headroom_blocks
        self.num_local_computed_tokens = num_local_computed_tokens


def positional_hop(method: Callable[..., Any]) -> Callable[..., Any]:
    """One hop passing the nine values on positionally."""
    def hop(rid: str, hit: Any, computed: int, total: int, tokens: int, encoder: int = 0,
            main: int | None = None, headroom: int = 0, local: int | None = None) -> Any:
        return method(rid, hit, computed, total, tokens, encoder, main, headroom, local)
    return hop


def record_hop(method: Callable[..., Any]) -> Callable[..., Any]:
    """One hop building the record, one reading it back (a record-taking method's cost)."""
    def take(a: AllocateArgs) -> Any:
        return method(a.request_id, a.hit, a.num_computed_tokens, a.total_computed_tokens,
                      a.num_tokens, a.num_encoder_tokens, a.num_tokens_main_model,
                      a.headroom_blocks, a.num_local_computed_tokens)

    def hop(rid: str, hit: Any, computed: int, total: int, tokens: int, encoder: int = 0,
            main: int | None = None, headroom: int = 0, local: int | None = None) -> Any:
        return take(AllocateArgs(rid, hit, computed, total, tokens, encoder, main, headroom,
                                 local))
    return hop


class AllocateTuple(NamedTuple):
    """The same record as a NamedTuple, built from a tuple (no Python ``__new__``)."""

    request_id: str
    hit: Any
    num_computed_tokens: int
    total_computed_tokens: int
    num_tokens: int
    num_encoder_tokens: int
    num_tokens_main_model: int | None
    headroom_blocks: int
    num_local_computed_tokens: int | None


def namedtuple_hop(method: Callable[..., Any]) -> Callable[..., Any]:
    """As :func:`record_hop` with :class:`AllocateTuple` (fields read by attribute)."""
    make = tuple.__new__

    def take(a: AllocateTuple) -> Any:
        return method(a.request_id, a.hit, a.num_computed_tokens, a.total_computed_tokens,
                      a.num_tokens, a.num_encoder_tokens, a.num_tokens_main_model,
                      a.headroom_blocks, a.num_local_computed_tokens)

    def hop(rid: str, hit: Any, computed: int, total: int, tokens: int, encoder: int = 0,
            main: int | None = None, headroom: int = 0, local: int | None = None) -> Any:
        return take(make(AllocateTuple, (rid, hit, computed, total, tokens, encoder, main,
                                         headroom, local)))
    return hop


def keyword_hop(method: Callable[..., Any]) -> Callable[..., Any]:
    """One hop passing the values after the request id as keywords."""
    def hop(rid: str, hit: Any, computed: int, total: int, tokens: int, encoder: int = 0,
            main: int | None = None, headroom: int = 0, local: int | None = None) -> Any:
        return method(rid, hit, num_computed_tokens=computed, total_computed_tokens=total,
                      num_tokens=tokens, num_encoder_tokens=encoder,
                      num_tokens_main_model=main, headroom_blocks=headroom,
                      num_local_computed_tokens=local)
    return hop


FORMS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "positional": positional_hop, "record": record_hop, "namedtuple": namedtuple_hop,
    "keywords": keyword_hop}


class _Spec(NamedTuple):
    """A harness request as ``lockstep.replay_lockstep`` reads it."""

    rid: str
    prompt: list[int]
    decode: list[int]


def run_round(flags: list[str]) -> dict[str, float]:
    """One lockstep replay of the harness workload; seconds in the core calls per form."""
    ap = argparse.ArgumentParser()
    kv_workload.add_workload_args(ap)
    args = kv_workload.parse_with_preset(ap, flags)
    reqs = kv_workload.build_workload(args)
    args.max_model_len = max(len(r.prompt) + len(r.decode) for r in reqs)
    mgrs = []
    for form in FORMS:
        mgr = PagedKVAdapter(args).mgr
        coordinator = mgr.coordinator
        coordinator.allocate = FORMS[form](coordinator.allocate)  # type: ignore[method-assign]  # this one
        mgrs.append(mgr)
    specs = [_Spec(r.request_id, r.prompt, r.decode) for r in reqs]
    spent = replay_lockstep(mgrs, specs, concurrency=args.concurrency)
    return dict(zip(FORMS, spent, strict=True))


def _noop(request_id: str, hit: Any, num_computed_tokens: int, total_computed_tokens: int,
          num_tokens: int, num_encoder_tokens: int = 0, num_tokens_main_model: int | None = None,
          headroom_blocks: int = 0, num_local_computed_tokens: int | None = None) -> Any:
    """``Coordinator.allocate``'s signature, doing nothing."""
    return hit


def micro_ns(number: int = 200_000, repeat: int = 7) -> dict[str, float]:
    """Nanoseconds per call of each form's hop in front of :func:`_noop` (min of repeats)."""
    args = ("r", None, 0, 16, 32, 0, 32, 0, 16)
    out = {}
    for form, make in FORMS.items():
        hop = make(_noop)
        best = min(timeit.repeat(functools.partial(hop, *args), number=number, repeat=repeat))
        out[form] = best / number * 1e9
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="new-request-heavy", choices=sorted(kv_workload.PRESETS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("workload", nargs=argparse.REMAINDER, help="-- flags for the harness")
    a = ap.parse_args(argv)
    extra = [f for f in a.workload if f != "--"]
    flags = ["--preset", a.preset, "--hash-algo", "sha256_cbor", *extra]
    core = "compiled" if native.active() is not None else "pure"
    ns = micro_ns()
    print(f"hop alone on the {core} core (ns per call, min of 7 x 200,000): " + ", ".join(
        f"{form} {ns[form]:.0f}" for form in FORMS))
    print("  per allocation against positionals: " + ", ".join(
        f"{form} {ns[form] - ns['positional']:+.0f} ns" for form in FORMS if form != "positional"))
    costs: dict[str, list[float]] = {form: [] for form in FORMS}
    for r in range(a.rounds):
        gc.collect()
        gc.disable()
        try:
            spent = run_round(flags)
        finally:
            gc.enable()
        base = spent["positional"]
        for form in FORMS:
            costs[form].append(100 * (spent[form] / base - 1))
        print(f"round {r + 1}: " + ", ".join(
            f"{form} {spent[form]:.3f} s ({costs[form][-1]:+.1f} %)" for form in FORMS))
    print(f"{a.preset} on the {core} core, lockstep, median of {a.rounds} rounds, "
          "lookup/allocate/free time against positional:")
    for form in FORMS:
        print(f"  {form:<10} {statistics.median(costs[form]):+6.1f} %")


if __name__ == "__main__":
    main()
