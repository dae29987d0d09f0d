"""Seeded random operation sequences, applied to both sides with a comparison after each.

The scheduler model is deliberately small: requests wait, are admitted (prefix lookup +
allocation, whole prompt or one chunk), run (next prefill chunk or one decode token, with
optional lookahead slots), finish, or are preempted (freed and re-admitted later with a
new lookup). Refusals are frequent because pools are small. Prompts come from a few shared
prefixes, exact repeats and multi-turn continuations, with LoRA adapters (one name pointed
at two paths), cache salts (``None``, ``""`` and a real one) and multimodal items.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from conformance.external import draw_external
from conformance.layouts import Layout
from conformance.model import ReqDesc, Snapshot
from conformance.replay import plan_admission

__all__ = ["Divergence", "Mismatch", "SeedResult", "Side", "run_seed"]

_LORAS: tuple[tuple[str, int, str] | None, ...] = (
    None,
    None,
    None,
    ("ad1", 1, "/adapters/ad1"),
    ("ad1", 1, "/adapters/ad1-v2"),
    ("ad2", 2, "/adapters/ad2"),
)
_SALTS: tuple[str | None, ...] = (None, None, None, None, "", "tenant-1")
_OPS = ("new", "admit", "step", "finish", "preempt", "reset", "new-step")
_OP_WEIGHTS = (18, 20, 66, 10, 5, 1, 12)
#: With ``bursts``: three requests with one prompt admitted with small first chunks, so
#: several requests compute (and register) the same blocks: duplicates in the index.
_BURST_OPS = (*_OPS, "burst")
_BURST_WEIGHTS = (*_OP_WEIGHTS, 8)


class Side(Protocol):
    name: str

    def new_request(self, d: ReqDesc) -> None: ...
    def append_token(self, rid: str, token: int) -> None: ...
    def lookup(self, rid: str) -> tuple[int, tuple[list[int], ...]]: ...
    def truncate(self, rid: str, num_tokens: int) -> tuple[int, tuple[list[int], ...]]: ...
    def allocate(
        self, rid: str, num_new: int, lookahead: int, use_hit: bool,
        reserved: int = 0, has_scheduled: bool = True, must_fit: bool = False,
        external: int = 0, skip_zeroing: tuple[int, ...] = (), delay: bool = False,
    ) -> tuple[list[int], ...] | None: ...
    def pop_for_free(self, rid: str) -> list[int]: ...
    def release_deferred(self) -> None: ...
    def zero_from(self, rid: str, start_token: int) -> None: ...
    def take_zeroing(self) -> list[int]: ...
    def take_copies(self) -> list[tuple[int, int]]: ...
    def estimate(self, rid: str) -> int: ...
    def commit(self, rid: str, num_tokens: int) -> None: ...
    def free(self, rid: str) -> None: ...
    def preempt(self, rid: str) -> None: ...
    def reset(self) -> bool: ...
    def new_step(self) -> None: ...
    def block_hashes(self, rid: str) -> list[bytes]: ...
    def snapshot(self) -> Snapshot: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """Where the two sides first disagreed."""

    seed: int
    op_index: int
    op: str
    detail: str


@dataclass(slots=True, kw_only=True)
class SeedResult:
    """One seed's outcome and the time each side spent in manager calls."""

    seed: int
    num_ops: int
    divergence: Divergence | None
    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Req:
    desc: ReqDesc
    tokens: list[int]
    computed: int = 0
    state: str = "waiting"  # waiting | running


class Mismatch(Exception):
    """The two sides answered differently (or a replayed transcript does not fit)."""


_UNTIMED = frozenset({"block_hashes", "commit", "estimate", "take_zeroing"})


class _Pair:
    """Calls one operation on both sides, timing each, and compares the answers."""

    def __init__(self, a: Side, b: Side | None) -> None:
        self.a, self.b = a, b
        self.seconds = {a.name: 0.0}
        if b is not None:
            self.seconds[b.name] = 0.0

    def call(self, what: str, method: str, *args: Any) -> Any:
        """Call ``method`` on both sides and compare; manager operations are timed, the
        comparison helper ``block_hashes`` and the engine's own ``commit`` are not."""
        clock = time.perf_counter
        t0 = clock()
        ra = getattr(self.a, method)(*args)
        t1 = clock()
        if self.b is None:  # recording the reference side alone
            if method not in _UNTIMED:
                self.seconds[self.a.name] += t1 - t0
            return ra
        rb = getattr(self.b, method)(*args)
        t2 = clock()
        if method not in _UNTIMED:
            self.seconds[self.a.name] += t1 - t0
            self.seconds[self.b.name] += t2 - t1
        if ra != rb:
            if isinstance(ra, list) and isinstance(rb, list) and ra and isinstance(ra[0], bytes):
                pairs = enumerate(zip(ra, rb, strict=False))
                k = next((k for k, (x, y) in pairs if x != y), min(len(ra), len(rb)))
                raise Mismatch(
                    f"{what}: first difference at block {k} of {len(ra)}/{len(rb)}: "
                    f"{self.a.name}={ra[k].hex()[:16] if k < len(ra) else None} "
                    f"{self.b.name}={rb[k].hex()[:16] if k < len(rb) else None}"
                )
            raise Mismatch(f"{what}: {self.a.name}={ra} {self.b.name}={rb}")
        return ra


def _make_prompt(
    rng: random.Random, prefixes: list[list[int]], finished: list[list[int]], max_len: int
) -> list[int]:
    r = rng.random()
    if finished and r < 0.15:
        base = list(rng.choice(finished))  # exact repeat of an earlier conversation
    elif finished and r < 0.35:
        base = list(rng.choice(finished)) + [
            rng.randrange(1, 30000) for _ in range(rng.randint(1, 24))
        ]
    else:
        prefix = rng.choice(prefixes)
        cut = rng.randint(0, len(prefix))
        base = prefix[:cut] + [rng.randrange(1, 30000) for _ in range(rng.randint(1, 48))]
    return base[:max_len]


def _make_mm(rng: random.Random, n: int) -> tuple[tuple[str, int, int], ...]:
    if n < 4 or rng.random() > 0.2:
        return ()
    items: list[tuple[str, int, int]] = []
    pos = rng.randrange(0, n // 2)
    for _ in range(rng.randint(1, 2)):
        length = rng.randint(2, 12)
        if pos + length > n:
            break
        items.append((rng.choice(("img-a", "img-b")), pos, length))
        pos += length + rng.randint(0, 10)
    return tuple(items)


def run_seed(
    layout: Layout,
    seed: int,
    num_ops: int,
    a: Side,
    b: Side | None,
    *,
    extras: frozenset[str] = frozenset({"lora", "salt", "mm"}),
    ignore: frozenset[str] = frozenset(),
    bursts: bool = False,
) -> SeedResult:
    """Drive ``a`` (the reference) and ``b`` with ``num_ops`` operations from ``seed``;
    stop at the first divergence. With ``b`` None, ``a`` runs alone (to record it).
    ``bursts`` adds the burst operation (another mix, so
    other sequences than without it)."""
    ops, weights = (_BURST_OPS, _BURST_WEIGHTS) if bursts else (_OPS, _OP_WEIGHTS)
    rng = random.Random(seed)
    # Headroom draws (reserved blocks, has_scheduled_reqs) come from their own stream so a
    # seed's operations are the same as before they were added.
    hrng = random.Random(seed * 7919 + 1)

    def headroom() -> tuple[int, bool]:
        reserved = 0 if hrng.random() < 0.7 else hrng.randint(1, 4)
        return reserved, hrng.random() < 0.6

    # The rest of the manager surface (full_sequence_must_fit, truncated hits, deferred
    # frees, blocks to zero) draws from a third stream, for the same reason.
    xrng = random.Random(seed * 104729 + 2)
    lcm = layout.scheduler_block_size
    all_full = all(g.kind in ("full", "mla") for g in layout.groups)
    unit = layout.prefix_match_unit

    def to_tail_boundary(r: _Req, done: int, num_new: int) -> int:
        """With a finer hash unit, often end a prefill chunk on the prompt's last hash
        boundary (where a Mamba state is kept for sub-block hits), as vLLM's scheduler
        does."""
        if unit is None or xrng.random() >= 0.5:
            return num_new
        target = (len(r.desc.prompt) - 1) // unit * unit
        return target - done if done < target < done + num_new else num_new

    # Bounded prefix replay (a swamla group): a fourth stream, drawn only on such layouts.
    replay = layout.replay_tokens
    rrng = random.Random(seed * 15485863 + 3)

    def replay_chunk() -> int:
        """Often a chunk ending inside the replayed range (0: none), on replay layouts."""
        return rrng.randint(1, replay) if replay and rrng.random() < 0.3 else 0

    # A KV connector's calls (connector layouts only) draw from a fourth stream.
    crng = random.Random(seed * 15485863 + 3)  # never with rrng: no layout has both

    def connector_lookup(r: _Req) -> int:
        """vLLM's scheduler with a connector that restores lagging groups' state
        (``get_computed_blocks_for_connector``): each group's own hit; with no external
        tokens (this model's connector finds none) a lagging group, deeper or shallower
        than full attention (group 0), falls back to the ordinary lookup. Returns the
        local hit adopted."""
        rid = r.desc.request_id
        lengths, _ids = pair.call(f"per-group lookup {rid}", "lookup_groups", rid)
        if any(n != lengths[0] for n in lengths):
            num_hit, _ids = pair.call(f"lookup {rid}", "lookup", rid)
            return int(num_hit)
        return int(lengths[0])

    # A connector's external loads (external_loads layouts only): a fifth stream.
    erng = random.Random(seed * 2147483647 + 5)

    pair = _Pair(a, b)
    reqs: dict[str, _Req] = {}
    finished: list[list[int]] = []
    prefixes = [[rng.randrange(1, 30000) for _ in range(rng.randint(8, 120))] for _ in range(4)]
    max_prompt = layout.max_model_len - 96
    counts: dict[str, int] = {}
    next_id = 0
    op = "start"
    i = 0
    cached: list[int] = []  # the cached blocks after the previous operation

    def check(rid: str) -> None:
        pair.call(f"block hashes of {rid}", "block_hashes", rid)

    try:
        for step in range(num_ops):
            i = step
            op = rng.choices(ops, weights)[0]
            waiting = [r for r in reqs.values() if r.state == "waiting"]
            running = [r for r in reqs.values() if r.state == "running"]
            if op == "new" or (not waiting and not running):
                op = "new"
                prompt = _make_prompt(rng, prefixes, finished, max_prompt)
                desc = ReqDesc(
                    request_id=f"r{next_id}",
                    prompt=tuple(prompt),
                    lora=rng.choice(_LORAS),
                    mm=_make_mm(rng, len(prompt)),
                    salt=rng.choice(_SALTS),
                )
                # The draws above happen whatever ``extras`` says, so a seed's sequence
                # of operations is the same with any subset of extras.
                desc = replace(
                    desc,
                    lora=desc.lora if "lora" in extras else None,
                    mm=desc.mm if "mm" in extras else (),
                    salt=desc.salt if "salt" in extras else None,
                )
                next_id += 1
                pair.call(f"new request {desc}", "new_request", desc)
                reqs[desc.request_id] = _Req(desc, list(prompt))
                check(desc.request_id)
            elif op == "admit" and waiting:
                r = rng.choice(waiting)
                rid = r.desc.request_id
                if layout.connector and crng.random() < 0.6:
                    num_hit = connector_lookup(r)
                else:
                    num_hit, _ids = pair.call(f"lookup {rid}", "lookup", rid)
                cut = xrng.randrange(0, num_hit, lcm) if num_hit else 0
                if all_full and num_hit and xrng.random() < 0.2:
                    num_hit, _ids = pair.call(f"truncate hit of {rid} to {cut}", "truncate",
                                              rid, cut)
                must_fit = xrng.random() < 0.3
                remaining = len(r.tokens) - num_hit
                num_new = remaining if rng.random() < 0.6 else rng.randint(1, remaining)
                lookahead = rng.randint(1, 4) if rng.random() < 0.2 else 0
                if must_fit and xrng.random() < 0.7:  # chunked prefill: a small first chunk
                    num_new = min(num_new, xrng.randint(1, 16))
                num_new = to_tail_boundary(r, num_hit, num_new)
                reserved, scheduled = headroom()
                plan = plan_admission(replay, num_hit, num_new, replay_chunk())
                ext = (draw_external(erng, len(r.tokens) - num_hit, len(layout.groups), lcm)
                       if layout.external_loads else None)
                if ext is not None:
                    # vLLM counts no block for a Mamba group's loaded state and raises
                    # where the pool lacks it (conformance/external.py): keep one free.
                    reserved = max(reserved, sum(g.kind == "mamba" for g in layout.groups))
                    plan = plan._replace(num_new=ext.num_new,
                                         computed=num_hit + ext.num_external + ext.num_new)
                out = pair.call(
                    f"allocate {rid} new={plan.num_new} hit={num_hit} la={lookahead} "
                    f"reserved={reserved} has_scheduled={scheduled} must_fit={must_fit}"
                    + ("" if plan.use_hit else " (hit dropped: within the replay window)")
                    + ("" if ext is None else f" {ext}"),
                    "allocate",
                    rid,
                    plan.num_new,
                    lookahead,
                    plan.use_hit,
                    reserved,
                    scheduled,
                    must_fit,
                    *(() if ext is None else ext.call_args()),
                )
                if out is not None:
                    r.computed = plan.computed
                    r.state = "running"
                    pair.call("commit", "commit", rid, r.computed)
            elif op == "step" and running:
                r = rng.choice(running)
                rid = r.desc.request_id
                lookahead = rng.randint(1, 4) if rng.random() < 0.2 else 0
                reserved, scheduled = headroom()
                if r.computed >= len(r.tokens) and len(r.tokens) >= layout.max_model_len - 8:
                    op = "finish-at-limit"
                    pair.call(f"free {rid}", "free", rid)
                    finished.append(r.tokens)
                    del reqs[rid]
                elif r.computed < len(r.tokens):
                    rest = len(r.tokens) - r.computed
                    num_new = rest if rng.random() < 0.5 else rng.randint(1, rest)
                    num_new = to_tail_boundary(r, r.computed, num_new)
                    op = "prefill-chunk"
                else:
                    token = rng.randrange(1, 30000)
                    pair.call(f"append to {rid}", "append_token", rid, token)
                    r.tokens.append(token)
                    check(rid)
                    num_new = 1
                    op = "decode"
                out = (
                    None
                    if op == "finish-at-limit"
                    else pair.call(
                        f"allocate {rid} new={num_new} la={lookahead} reserved={reserved} "
                        f"has_scheduled={scheduled}",
                        "allocate",
                        rid,
                        num_new,
                        lookahead,
                        False,
                        reserved,
                        scheduled,
                    )
                )
                if op == "finish-at-limit":
                    pass
                elif out is None:
                    op += "-refused-preempt"
                    pair.call(f"preempt {rid}", "preempt", rid)
                    r.computed = 0
                    r.state = "waiting"
                else:
                    r.computed += num_new
                    pair.call("commit", "commit", rid, r.computed)
                    if xrng.random() < 0.05:
                        start = xrng.randint(0, r.computed // lcm) * lcm
                        pair.call(f"record {rid} for zeroing from {start}", "zero_from",
                                  rid, start)
            elif op == "finish" and running:
                r = rng.choice(running)
                if layout.connector:
                    pair.call(f"finalize partial tails of {r.desc.request_id}",
                              "finalize_tails", r.desc.request_id)
                if xrng.random() < 0.3:
                    op = "finish-deferred"
                    pair.call(f"pop blocks of {r.desc.request_id}", "pop_for_free",
                              r.desc.request_id)
                else:
                    pair.call(f"free {r.desc.request_id}", "free", r.desc.request_id)
                finished.append(r.tokens)
                del reqs[r.desc.request_id]
            elif op == "preempt" and running:
                r = rng.choice(running)
                pair.call(f"preempt {r.desc.request_id}", "preempt", r.desc.request_id)
                r.computed = 0
                r.state = "waiting"
            elif op == "new-step":
                pair.call("block copies of the step", "take_copies")
                pair.call("release deferred frees", "release_deferred")
                pair.call("new step starts", "new_step")
            elif op == "burst":
                prompt = _make_prompt(rng, prefixes, finished, max_prompt)
                for _ in range(3):
                    rid = f"r{next_id}"
                    next_id += 1
                    desc = ReqDesc(request_id=rid, prompt=tuple(prompt))
                    pair.call(f"new request {desc}", "new_request", desc)
                    r = _Req(desc, list(prompt))
                    reqs[rid] = r
                    num_hit, _ids = pair.call(f"lookup {rid}", "lookup", rid)
                    num_new = min(len(prompt) - num_hit, rng.randint(1, 8))
                    plan = plan_admission(replay, num_hit, num_new)
                    out = pair.call(
                        f"allocate {rid} new={plan.num_new} hit={num_hit}",
                        "allocate",
                        rid,
                        plan.num_new,
                        0,
                        plan.use_hit,
                    )
                    if out is not None:
                        r.computed = plan.computed
                        r.state = "running"
                        pair.call("commit", "commit", rid, r.computed)
            elif op == "reset":
                pair.call("reset prefix cache", "reset")
            else:
                op = "idle"
            counts[op] = counts.get(op, 0) + 1
            for rid in reqs:  # a read-only query: compared for every request, every op
                pair.call(f"estimate cached tokens of {rid}", "estimate", rid)
            pair.call("blocks to zero", "take_zeroing")
            if xrng.random() < 0.3:  # copies taken mid-step too (their blocks then free)
                pair.call("block copies", "take_copies")
            if layout.connector:
                if cached and crng.random() < 0.15:  # a connector evicts a cached block
                    victim = crng.choice(cached)
                    pair.call(f"evict block {victim}", "evict", victim)
                pair.call("boundary-state offloads", "take_offloads")
            snap = a.snapshot()
            cached = sorted(snap.cached)
            if b is not None:
                _compare(snap, b.snapshot(), ignore)
    except Mismatch as exc:
        return SeedResult(
            seed=seed,
            num_ops=i + 1,
            counts=counts,
            seconds=pair.seconds,
            divergence=Divergence(seed=seed, op_index=i, op=op, detail=str(exc)),
        )
    return SeedResult(
        seed=seed, num_ops=num_ops, divergence=None, seconds=pair.seconds, counts=counts
    )


def _compare(sa: Snapshot, sb: Snapshot, ignore: frozenset[str]) -> None:
    diff = sa.diff(sb, ignore)
    if diff is not None:
        raise Mismatch(f"state after op: {diff}")
