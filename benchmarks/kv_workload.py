"""The side-by-side harness's workload: one deterministic request stream, any KV-cache
manager.

Standard library only, so the same file runs under pagedkv's interpreter
(``vllm_compare_adapter.py``) and under vLLM's (``vllm_driver.py``). It

1. builds the requests: a synthetic stream (system prompts shared by a fraction of the
   requests, plus a random suffix and random decode tokens) or a Mooncake-format trace
   (``hash_ids``: one id per ``--trace-block-tokens`` prompt tokens, equal ids = equal
   tokens; ``.jsonl`` or ``.jsonl.gz``);
2. replays them through an adapter (:class:`Adapter`) in a small continuous-batching loop:
   each step admits waiting requests while fewer than ``--concurrency`` run (hash the
   prompt, look up its cached prefix, allocate the rest), then gives every request admitted
   in an earlier step one decode token (append it, allocate one slot) and frees a request
   after its last decode token. A refused admission waits for running requests to finish
   (or, with none running, drops the request); a refused decode frees the request;
3. times every adapter call and returns one JSON-able dict: ``core_ops_per_s`` (lookups,
   allocations and frees divided by their summed time), ``core_plus_hash_ops_per_s`` (adds
   prompt hashing and token appends), the hit rate, and two digests of what the manager
   answered: ``digest_lookup`` (every hit length and hit block ids) and ``digest_alloc``
   (every newly allocated block id). Equal digests on one workload mean block-id-exact
   behaviour.

Presets (``PRESETS``): ``shared-prompt`` (the defaults: 2,000
requests sharing one 1,024-token system prompt, 10,000 blocks of 16 tokens, 32 running),
``heavy-eviction`` (1,500 blocks, 8 system prompts, 80 % of requests sharing one),
``mooncake`` (the first 1,000 usable requests of the bundled Mooncake conversation trace,
16 running) and ``new-requests`` (every prompt new and unshared, 256-2,048 tokens: a hash
per block, the path new requests take) and ``new-request-heavy`` (600 such prompts with 1-4
decode tokens each: admission, lookup and free dominate, the decode step hardly counts).

Worked example::

    >>> import argparse
    >>> ap = argparse.ArgumentParser(); add_workload_args(ap)
    >>> reqs = build_workload(ap.parse_args(["--num-requests", "3", "--seed", "1"]))
    >>> [len(r.prompt) >= 1024 + 16 for r in reqs], workload_digest(reqs)[:8]
    ([True, True, True], '80289bca')
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CORE_OPS",
    "DEFAULT_TRACE",
    "HASH_OPS",
    "PRESETS",
    "Adapter",
    "BenchRequest",
    "add_workload_args",
    "build_workload",
    "parse_with_preset",
    "replay",
    "run_cli",
    "workload_digest",
]

HERE = os.path.dirname(os.path.abspath(__file__))
#: The Mooncake conversation trace's first 1,500 requests, shipped with pagedkv.
DEFAULT_TRACE = os.path.join(
    os.path.dirname(HERE), "src", "pagedkv", "data", "traces", "conversation_trace_head.jsonl"
)
PRESETS: dict[str, list[str]] = {
    "shared-prompt": [],
    "heavy-eviction": [
        "--num-blocks", "1500", "--num-system-prompts", "8", "--shared-fraction", "0.8",
    ],
    "mooncake": ["--trace", DEFAULT_TRACE, "--trace-limit", "1000", "--concurrency", "16"],
    "new-requests": [
        "--shared-fraction", "0", "--suffix-len-min", "256", "--suffix-len-max", "2048",
    ],
    "new-request-heavy": [
        "--shared-fraction", "0", "--suffix-len-min", "256", "--suffix-len-max", "2048",
        "--num-requests", "600", "--decode-min", "1", "--decode-max", "4",
    ],
}
CORE_OPS = ("lookup", "allocate_prefill", "allocate_decode", "free")
HASH_OPS = ("hash_prompt", "append_token")


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request: its prompt and the tokens it will decode, one per step."""

    request_id: str
    prompt: list[int]
    decode: list[int]


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The workload, cache and run flags every driver accepts (identical on all sides)."""
    w = ap.add_argument_group("workload")
    w.add_argument("--num-requests", type=int, default=2000)
    w.add_argument("--num-system-prompts", type=int, default=1,
                   help="distinct shared prefixes, used round-robin")
    w.add_argument("--system-prompt-len", type=int, default=1024, help="tokens")
    w.add_argument("--shared-fraction", type=float, default=1.0,
                   help="fraction of requests that start with a system prompt")
    w.add_argument("--suffix-len-min", type=int, default=16, help="tokens")
    w.add_argument("--suffix-len-max", type=int, default=512, help="tokens")
    w.add_argument("--decode-min", type=int, default=16, help="decode tokens per request")
    w.add_argument("--decode-max", type=int, default=128, help="decode tokens per request")
    w.add_argument("--concurrency", type=int, default=32, help="running requests at most")
    w.add_argument("--vocab-size", type=int, default=32000)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--trace", default=None,
                   help="Mooncake-format trace (.jsonl or .jsonl.gz) instead of the "
                        "synthetic stream")
    w.add_argument("--trace-limit", type=int, default=500, help="first N usable requests")
    w.add_argument("--trace-block-tokens", type=int, default=512,
                   help="prompt tokens per hash id (Mooncake: 512)")
    w.add_argument("--max-decode", type=int, default=64, help="cap on a trace's output")
    w.add_argument("--max-prompt", type=int, default=16384,
                   help="skip trace requests with a longer prompt (tokens)")
    c = ap.add_argument_group("cache")
    c.add_argument("--block-size", type=int, default=16, help="tokens per block")
    c.add_argument("--num-blocks", type=int, default=10_000, help="including the null block")
    c.add_argument("--max-model-len", type=int, default=None,
                   help="tokens (default: the longest request of the workload)")
    c.add_argument("--no-prefix-caching", action="store_true")
    c.add_argument("--hash-algo", default="sha256",
                   choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
                   help="vLLM's names; pagedkv runs the CBOR form of sha256/xxhash")
    c.add_argument("--kv-events", action="store_true", help="record and drain KV events")
    r = ap.add_argument_group("run")
    r.add_argument("--repeat", type=int, default=1, help="fresh managers, one after another")
    r.add_argument("--no-digest", action="store_true", help="skip the block-id digests")


def parse_with_preset(
    ap: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """Parse ``argv`` with ``--preset NAME`` (a :data:`PRESETS` workload) expanded in front
    of the other flags, so a flag given explicitly wins over the preset's."""
    ap.add_argument("--preset", choices=sorted(PRESETS),
                    help="one of the standard workloads (flags after it still apply)")
    given = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", choices=sorted(PRESETS))
    known, _rest = pre.parse_known_args(given)
    return ap.parse_args([*PRESETS.get(known.preset or "", []), *given])


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def synthetic_workload(a: argparse.Namespace) -> list[BenchRequest]:
    """System prompts drawn first, then per request: shared or not, suffix, decode."""
    rng = random.Random(a.seed)
    prompts = [_tokens(rng, a.system_prompt_len, a.vocab_size)
               for _ in range(max(1, a.num_system_prompts))]
    out = []
    for i in range(a.num_requests):
        prefix = prompts[i % len(prompts)] if rng.random() < a.shared_fraction else []
        suffix = _tokens(rng, rng.randint(a.suffix_len_min, a.suffix_len_max), a.vocab_size)
        decode = _tokens(rng, rng.randint(a.decode_min, a.decode_max), a.vocab_size)
        out.append(BenchRequest(f"req-{i}", prefix + suffix, decode))
    return out


def _open_trace(path: str) -> Any:
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def trace_workload(a: argparse.Namespace) -> list[BenchRequest]:
    """A trace's requests as token ids: hash id ``h`` is ``--trace-block-tokens`` tokens
    drawn from a generator seeded with ``(h, --seed)``, so equal ids share tokens; decode
    tokens come from one generator over the whole trace."""
    blocks: dict[int, list[int]] = {}
    extra = random.Random(a.seed * 31 + 7)
    out: list[BenchRequest] = []
    with _open_trace(a.trace) as fh:
        for number, line in enumerate(fh, 1):
            if len(out) >= a.trace_limit:
                break
            try:
                rec = json.loads(line)
                prompt_len = int(rec["input_length"])
                ids = [int(h) for h in rec["hash_ids"]]
                output_len = int(rec.get("output_length", 1))
            except (ValueError, KeyError, TypeError) as exc:
                raise SystemExit(f"{a.trace}:{number}: not a Mooncake record ({exc})") from None
            if not 0 < prompt_len <= a.max_prompt:
                continue
            prompt: list[int] = []
            for h in ids:
                if h not in blocks:
                    blocks[h] = _tokens(random.Random(h * 1_000_003 + a.seed),
                                        a.trace_block_tokens, a.vocab_size)
                prompt += blocks[h]
            prompt = prompt[:prompt_len]
            prompt += _tokens(extra, prompt_len - len(prompt), a.vocab_size)
            decode = _tokens(extra, max(1, min(output_len, a.max_decode)), a.vocab_size)
            out.append(BenchRequest(f"req-{len(out)}", prompt, decode))
    return out


def build_workload(a: argparse.Namespace) -> list[BenchRequest]:
    return trace_workload(a) if a.trace else synthetic_workload(a)


def workload_digest(reqs: Sequence[BenchRequest]) -> str:
    """16 hex digits naming the workload (both sides print it: same digest, same input)."""
    h = hashlib.sha256()
    for r in reqs:
        h.update(f"{r.request_id}|{r.prompt}|{r.decode}\n".encode())
    return h.hexdigest()[:16]


class Adapter(Protocol):
    """A KV-cache manager as the replay drives it. ``lookup`` returns a handle and the hit
    length in tokens; ``allocate_*`` the new block ids, or None when refused."""

    name: str

    def make_request(self, spec: BenchRequest) -> Any: ...
    def hash_prompt(self, req: Any) -> None: ...
    def lookup(self, req: Any) -> tuple[Any, int]: ...
    def lookup_block_ids(self, handle: Any) -> list[int]: ...
    def allocate_prefill(
        self, req: Any, num_new_tokens: int, num_computed_tokens: int, handle: Any
    ) -> list[int] | None: ...
    def after_prefill(self, req: Any) -> None: ...
    def append_token(self, req: Any, token: int) -> None: ...
    def allocate_decode(self, req: Any) -> list[int] | None: ...
    def after_decode(self, req: Any) -> None: ...
    def free(self, req: Any) -> None: ...
    def take_events(self) -> int: ...
    def num_free_blocks(self) -> int: ...
    def usage(self) -> float: ...
    def extra_stats(self) -> dict[str, Any]: ...


class _Clock:
    """Per-operation call durations in nanoseconds."""

    def __init__(self) -> None:
        self.ns: dict[str, list[int]] = {}

    def call(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = fn(*args)
        self.ns.setdefault(op, []).append(time.perf_counter_ns() - t0)
        return out

    def rate(self, ops: Sequence[str]) -> float | None:
        return _rate(self.ns, ops)

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for op, ns in self.ns.items():
            s = sorted(ns)
            out[op] = {
                "count": len(s),
                "mean_us": round(sum(s) / len(s) / 1e3, 3),
                "p50_us": round(s[len(s) // 2] / 1e3, 3),
                "p99_us": round(s[min(len(s) - 1, len(s) * 99 // 100)] / 1e3, 3),
            }
        return out


@dataclass(slots=True)
class _Running:
    req: Any
    spec: BenchRequest
    next_token: int
    admitted_step: int


def replay(adapter: Adapter, reqs: Sequence[BenchRequest], concurrency: int,
           digest: bool = True) -> dict[str, Any]:
    """Drive ``adapter`` through ``reqs`` (see the module docstring); the result dict."""
    clock = _Clock()
    d_lookup, d_alloc = hashlib.sha256(), hashlib.sha256()
    waiting = list(reversed(reqs))  # pop() takes the next request
    running: list[_Running] = []
    st = {"steps": 0, "prompt_tokens": 0, "hit_tokens": 0, "dropped": 0,
          "admission_waits": 0, "failed_decodes": 0, "kv_events": 0}
    peak_usage = 0.0
    wall0 = time.perf_counter()
    while waiting or running:
        st["steps"] += 1
        step = st["steps"]
        while waiting and len(running) < concurrency:
            spec = waiting[-1]
            req = clock.call("make_request", adapter.make_request, spec)
            clock.call("hash_prompt", adapter.hash_prompt, req)
            handle, hit = clock.call("lookup", adapter.lookup, req)
            new = clock.call("allocate_prefill", adapter.allocate_prefill, req,
                             len(spec.prompt) - hit, hit, handle)
            if new is None:
                if running:  # wait for running requests to free blocks
                    st["admission_waits"] += 1
                    break
                waiting.pop()  # it cannot fit even in an empty cache
                st["dropped"] += 1
                continue
            waiting.pop()
            adapter.after_prefill(req)
            st["prompt_tokens"] += len(spec.prompt)
            st["hit_tokens"] += hit
            if digest:
                d_lookup.update(f"{spec.request_id} {hit} {adapter.lookup_block_ids(handle)}"
                                .encode())
                d_alloc.update(f"{spec.request_id} prefill {new}".encode())
            if spec.decode:
                running.append(_Running(req, spec, 0, step))
            else:
                clock.call("free", adapter.free, req)
        kept: list[_Running] = []
        for item in running:
            if item.admitted_step == step:  # decodes from the next step on
                kept.append(item)
                continue
            clock.call("append_token", adapter.append_token, item.req,
                       item.spec.decode[item.next_token])
            new = clock.call("allocate_decode", adapter.allocate_decode, item.req)
            if new is None:
                st["failed_decodes"] += 1
                clock.call("free", adapter.free, item.req)
                continue
            adapter.after_decode(item.req)
            if digest and new:
                d_alloc.update(f"{item.spec.request_id} {item.next_token} {new}".encode())
            item.next_token += 1
            if item.next_token == len(item.spec.decode):
                clock.call("free", adapter.free, item.req)
            else:
                kept.append(item)
        running = kept
        peak_usage = max(peak_usage, adapter.usage())
        st["kv_events"] += max(0, adapter.take_events())
    return {
        "core_ops_per_s": clock.rate(CORE_OPS),
        "core_op_time_s": round(sum(sum(clock.ns.get(op, ())) for op in CORE_OPS) / 1e9, 6),
        "core_plus_hash_ops_per_s": clock.rate(CORE_OPS + HASH_OPS),
        "wall_s": round(time.perf_counter() - wall0, 4),
        **st,
        "hit_rate": round(st["hit_tokens"] / max(1, st["prompt_tokens"]), 6),
        "peak_usage": round(peak_usage, 6),
        "final_free_blocks": adapter.num_free_blocks(),
        "digest_lookup": d_lookup.hexdigest()[:16] if digest else None,
        "digest_alloc": d_alloc.hexdigest()[:16] if digest else None,
        "ops": clock.summary(),
        "extra": adapter.extra_stats(),
        "call_ns": clock.ns,
    }


def run_cli(make_adapter: Callable[[argparse.Namespace], Adapter], args: argparse.Namespace,
            info: dict[str, Any]) -> dict[str, Any]:
    """Build the workload, replay it ``--repeat`` times on fresh managers; the first run's
    result with ``info``, the workload's digest and, with repeats, every run's ops/s."""
    reqs = build_workload(args)
    if not reqs:
        raise SystemExit("the workload has no requests")
    longest = max(len(r.prompt) + len(r.decode) for r in reqs)
    if args.max_model_len is None:
        args.max_model_len = longest
    runs = [replay(make_adapter(args), reqs, args.concurrency, digest=not args.no_digest)
            for _ in range(args.repeat)]
    call_ns = [r.pop("call_ns") for r in runs]
    out = {**info, "params": vars(args), "workload_digest": workload_digest(reqs),
           "num_requests": len(reqs), "max_seq_len": longest, **runs[0]}
    if len(runs) > 1:
        out["repeats_core_ops_per_s"] = [r["core_ops_per_s"] for r in runs]
        out["repeats_core_plus_hash_ops_per_s"] = [r["core_plus_hash_ops_per_s"] for r in runs]
        best = best_call_ns(call_ns)
        out["best_core_ops_per_s"] = _rate(best, CORE_OPS)
        out["best_core_plus_hash_ops_per_s"] = _rate(best, CORE_OPS + HASH_OPS)
    return out


def best_call_ns(replays: Sequence[dict[str, list[int]]]) -> dict[str, list[int]]:
    """Per operation type, each call's fastest time over ``replays`` of the same workload
    (the same calls in the same order on fresh managers): what the code costs, with the
    pauses a shared machine adds to one replay's call (a descheduling, another process's
    cache traffic) left out unless they hit that call in every replay.

    >>> best_call_ns([{"free": [5, 9]}, {"free": [7, 4]}])
    {'free': [5, 4]}

    Raises:
        ValueError: the replays made different calls (the workload is not deterministic).
    """
    first = replays[0]
    for other in replays[1:]:
        if {op: len(v) for op, v in other.items()} != {op: len(v) for op, v in first.items()}:
            raise ValueError("the replays made different calls; best-of-replays needs the "
                             "same calls in the same order")
    return {op: [min(ns) for ns in zip(*(r[op] for r in replays), strict=True)]
            for op in first}


def _rate(call_ns: dict[str, list[int]], ops: Sequence[str]) -> float | None:
    """Calls of ``ops`` per second of their summed time."""
    n = sum(len(call_ns.get(op, ())) for op in ops)
    total_ns = sum(sum(call_ns.get(op, ())) for op in ops)
    return round(n / (total_ns / 1e9), 1) if total_ns else None
