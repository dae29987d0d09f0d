"""``pagedkv index serve`` and ``pagedkv index query``: the cluster index from a shell.

``serve`` follows publishers' event streams into Redis until SIGTERM or SIGINT (a status
line every ``--status-every`` seconds on stderr); ``query`` answers which replica holds
the longest prefix of a prompt. Errors print one line and exit 1 (2 for usage).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from pagedkv import (
    BlockHasher,
    FullAttentionSpec,
    HashExtras,
    InvalidArgumentError,
    KVCacheSpec,
    Request,
    SlidingWindowSpec,
)
from pagedkv.cli_args import seconds_arg
from pagedkv.cluster.index import ClusterIndex
from pagedkv.cluster.router import CacheAware, Router
from pagedkv.input_files import read_text

__all__ = ["MAX_TOKEN_FILE_BYTES", "add_parser"]

#: The most bytes ``index query --tokens @FILE`` reads (about 6 million token ids).
MAX_TOKEN_FILE_BYTES = 64 * 2**20


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``index`` (with ``serve`` and ``query``) on an argparse sub-parsers action."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "index",
        help="cluster prefix index on Redis: ingest event streams, query longest prefixes",
        description="A prefix index of many engine replicas in Redis/Valkey, fed by their "
        "KV-cache event streams (pagedkv's or vLLM's). See docs/cluster.md.",
    )
    sub = p.add_subparsers(dest="index_command", metavar="ACTION")
    p.set_defaults(func=lambda args: _usage(p))

    serve = sub.add_parser("serve", help="follow publishers into Redis until SIGTERM")
    _common(serve)
    serve.add_argument("--subscribe", action="append", required=True,
                       metavar="[POD=]tcp://HOST:PORT[,replay=tcp://HOST:PORT]",
                       help="a publisher to follow (repeat for many)")
    serve.add_argument("--status-every", type=seconds_arg("--status-every"),
                       default=10.0, metavar="SECONDS",
                       help="status line period on stderr (default 10)")
    serve.add_argument("--request-timeout", type=seconds_arg("--request-timeout"),
                       default=1.0, metavar="SECONDS",
                       help="wait for a replay or snapshot answer (default 1)")
    serve.add_argument("--max-seconds", type=seconds_arg("--max-seconds", allow_zero=True),
                       default=None, metavar="SECONDS",
                       help="stop after this long (default: run until SIGTERM)")
    serve.add_argument("--writer-lease", type=seconds_arg("--writer-lease"), default=5.0,
                       metavar="SECONDS",
                       help="write each pod's entries under a lease in Redis: a second "
                       "'index serve' for the same pod stands by and takes over this long "
                       "after the writer dies (default 5)")
    serve.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                       help="serve Prometheus metrics (index size, events ingested, gaps, "
                       "resyncs) on 127.0.0.1:PORT (0: a free port, printed); needs "
                       "pagedkv[metrics]")
    serve.set_defaults(func=_serve)

    query = sub.add_parser("query", help="which replica holds the longest prefix")
    _common(query)
    what = query.add_mutually_exclusive_group(required=True)
    what.add_argument("--hashes", metavar="H,H,...",
                      help="the prompt's block hashes as on the wire (decimal or 0x hex)")
    what.add_argument("--tokens", metavar="T,T,...|@FILE",
                      help="prompt token ids (comma-separated, or @FILE of whitespace- or "
                      "comma-separated ids), hashed as the engines hash them")
    query.add_argument("--block-size", type=int, default=16, help="tokens per block (16)")
    query.add_argument("--hash-algo", default="sha256_cbor",
                       help="the engines' prefix-caching hash algorithm (sha256_cbor)")
    query.add_argument("--cache-salt", default=None, help="the request's cache salt")
    query.add_argument("--group", action="append", metavar="full|window:TOKENS",
                       help="KV-cache groups in order (default: one full-attention group)")
    query.add_argument("--num-tokens", type=int, default=None,
                       help="prompt length with --hashes (default: blocks x size + 1)")
    query.add_argument("--json", action="store_true", help="print JSON")
    query.set_defaults(func=_query)
    return p


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis", required=True, metavar="URL",
                   help="Redis/Valkey URL, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--model", default="default",
                   help="model name the index is namespaced by (default 'default')")


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help(sys.stderr)
    return 2


def _open_index(args: argparse.Namespace) -> ClusterIndex:
    from pagedkv.cluster.redis_index import RedisIndex, connect

    index = RedisIndex(connect(args.redis), model=args.model)
    index.replicas()  # fail now, with one line, when Redis is unreachable
    return index


def _serve(args: argparse.Namespace) -> int:
    from pagedkv.cluster.service import IndexService, parse_source

    if args.status_every <= 0 or args.request_timeout <= 0:
        raise InvalidArgumentError("--status-every and --request-timeout must be > 0")
    sources = [parse_source(text) for text in args.subscribe]
    port = args.metrics_port
    if port is not None and not 0 <= port <= 65535:
        raise InvalidArgumentError(f"--metrics-port must be in [0, 65535], got {port}")
    index = _open_index(args)
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    previous = [signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)]
    service = IndexService(index, sources, request_timeout_s=args.request_timeout,
                           lease_ttl_s=args.writer_lease)
    exporter = None
    try:
        print(f"pagedkv index serve: {len(sources)} publisher(s) -> {args.redis} "
              f"(model {args.model})", file=sys.stderr, flush=True)
        if port is not None:
            exporter = _serve_metrics(port)
        service.run(should_stop=lambda: stop["now"], status_every_s=args.status_every,
                    stream=sys.stderr, max_seconds=args.max_seconds,
                    on_step=None if exporter is None else lambda: exporter.update(service))
    finally:
        if exporter is not None:
            exporter.close()
        service.close()
        index.close()
        for s, handler in zip((signal.SIGTERM, signal.SIGINT), previous, strict=True):
            signal.signal(s, handler)
    return 0


def _serve_metrics(port: int) -> Any:
    """Start the index service's metrics server (its address on stderr)."""
    from pagedkv.cluster.index_metrics import IndexServiceExporter
    from pagedkv.observe.metrics_endpoint import serve_metrics

    exporter = IndexServiceExporter()
    serve_metrics(exporter, port)
    return exporter


def _groups(texts: list[str] | None, block_size: int) -> list[KVCacheSpec]:
    kw: dict[str, Any] = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1,
                          "dtype_bytes": 1}
    specs: list[KVCacheSpec] = []
    for text in texts or ["full"]:
        kind, _, window = text.partition(":")
        if kind == "full" and not window:
            specs.append(FullAttentionSpec(**kw))
        elif kind == "window" and window.isdigit() and int(window) > 0:
            specs.append(SlidingWindowSpec(sliding_window=int(window), **kw))
        else:
            raise InvalidArgumentError(f"--group {text!r}: expected 'full' or 'window:TOKENS'")
    return specs


def _int_list(text: str, what: str) -> list[int]:
    try:
        return [int(t, 0) for t in text.replace(",", " ").split()]
    except ValueError as exc:
        raise InvalidArgumentError(f"{what}: not a list of integers ({exc})") from exc


def _prompt(args: argparse.Namespace) -> tuple[list[int], int]:
    """Wire hashes and prompt length from --hashes or --tokens."""
    if args.hashes is not None:
        hashes = _int_list(args.hashes, "--hashes")
        if any(not 0 <= h < 1 << 64 for h in hashes):
            raise InvalidArgumentError("--hashes: each hash is an unsigned 64-bit integer")
        return hashes, args.num_tokens or len(hashes) * args.block_size + 1
    text = args.tokens
    if text.startswith("@"):
        text = _read_token_file(Path(text[1:]))
    tokens = _int_list(text, "--tokens")
    if not tokens:
        raise InvalidArgumentError("--tokens: the prompt is empty")
    from pagedkv.events.wire import wire_hash

    hasher = BlockHasher(args.block_size, algo=args.hash_algo)
    extras = None if args.cache_salt is None else HashExtras(cache_salt=args.cache_salt)
    request = Request("query", tokens, hasher=hasher, hash_extras=extras)
    return [wire_hash(h) for h in request.block_hashes], len(tokens)


def _read_token_file(path: Path) -> str:
    """The text of a ``--tokens @FILE`` file, read up to :data:`MAX_TOKEN_FILE_BYTES`
    (a device such as /dev/zero, or a huge file, is refused, not read into memory)."""
    return read_text(path, what="token-id file", max_bytes=MAX_TOKEN_FILE_BYTES)


def _query(args: argparse.Namespace) -> int:
    if args.block_size < 1:
        raise InvalidArgumentError("--block-size must be >= 1")
    if args.num_tokens is not None and args.num_tokens < 1:
        raise InvalidArgumentError(f"--num-tokens must be >= 1, got {args.num_tokens}")
    specs = _groups(args.group, args.block_size)
    hashes, num_tokens = _prompt(args)
    index = _open_index(args)
    try:
        registry = index.replicas()
        hits = Router(index, specs=specs, policy=CacheAware()).hit_tokens(hashes, num_tokens)
    finally:
        index.close()
    rows = sorted(registry.items(), key=lambda kv: (-hits.get(kv[0], 0), kv[0]))
    best = rows[0][0] if rows and hits.get(rows[0][0], 0) else None
    if args.json:
        print(json.dumps({
            "num_tokens": num_tokens, "num_blocks": len(hashes),
            "best": None if best is None else best.key,
            "replicas": [{"replica": r.key, "state": s.state, "blocks": s.num_blocks,
                          "hit_tokens": hits.get(r, 0)} for r, s in rows],
        }))
        return 0
    print(f"{'replica':<24} {'state':<10} {'blocks':>8} {'hit tokens':>10}")
    for replica, state in rows:
        print(f"{replica.key:<24} {state.state:<10} {state.num_blocks:>8} "
              f"{hits.get(replica, 0):>10}")
    if best is None:
        print(f"best: none of {len(rows)} replicas holds the first block")
    else:
        print(f"best: {best.key} ({hits[best]} of {num_tokens} tokens cached)")
    return 0
