"""Workloads: what the simulator replays, and the loaders for trace files.

A :class:`Workload` is a tuple of :class:`SimRequest` in arrival order. A request's prompt
content is given in one of three ways, which decide its block hashes at a block size ``b``
(:func:`request_block_hashes`):

* ``hash_ids`` (Mooncake-style traces): one id per ``source_block_size``-token block of the
  prompt (the last one possibly partial), with prefix semantics — equal ids at a position
  mean equal prompts up to the end of that block. Block ``i``'s chain digest is
  ``D_i = sha256(D_{i-1} || id_i as 8 little-endian bytes)`` (``D_-1`` a fixed root), so the
  derived hashes keep prefix semantics even if a trace reused an id under another prefix.

  - ``b == source_block_size``: block ``i`` hashes to ``D_i``;
  - ``b`` divides it (``k = source / b`` sub-blocks per source block): sub-block ``j`` of
    block ``i`` hashes to ``D_i || j`` (2 bytes). It depends on every earlier block and on
    ``j``. It also depends on the *whole* of block ``i`` (the trace says nothing finer), so
    two prompts that share only part of a source block never share its sub-blocks: derived
    hashes can under-count sharing inside a source block, never over-count it.
  - ``b`` a multiple of it (``m = b / source``): block ``i`` hashes to ``D_{(i+1)m-1}``.

  Only *full* blocks of the prompt get a hash (``num_prompt_tokens // b`` of them).
  Worked case, source 512, ``b`` = 256, 1200 prompt tokens, ``hash_ids = [7, 9, 4]``:
  4 full blocks -> ``[D_0||0, D_0||1, D_1||0, D_1||1]``; tokens 1024..1199 (block of id 4
  and the rest) stay unhashed, so the manager hashes them from their token ids later.
* ``prompt_token_ids`` (generators): real token ids; the manager hashes them itself.
* neither (length-only traces such as Azure's): no sharing at all; every block gets a hash
  unique to the request.

Tokens past the supplied hashes (the unhashed prompt tail and the decode tokens) are
placeholders: prompt tails are 0s and decode tokens are ``decode_token_id`` (unique per
request), so decode blocks never collide across requests. Generators give real output
tokens instead (a multi-turn reply reappears in the next turn's prompt).

Trace files are read by :mod:`pagedkv.sim.loaders` (one module per format).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pagedkv.errors import InvalidArgumentError

__all__ = [
    "MOONCAKE_BLOCK_SIZE",
    "SimRequest",
    "Workload",
    "bundled_trace_path",
    "check_block_size",
    "request_block_hashes",
]

#: Tokens per ``hash_ids`` entry in the Mooncake traces.
MOONCAKE_BLOCK_SIZE = 512
_ROOT = hashlib.sha256(b"pagedkv-sim-trace-root").digest()
_SUFFIX = [j.to_bytes(2, "big") for j in range(1 << 16)]
_BUNDLED = "conversation_trace_head.jsonl"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimRequest:
    """One request of a workload.

    ``arrival_s``: arrival time in seconds from the workload start. For a request with a
    ``parent`` (index of an earlier request in the same workload) it is only a nominal
    time used for ordering in pure-cache mode: the engine lets it arrive ``think_s``
    seconds after the parent finished (a closed loop: the next turn of a chat).
    ``num_output_tokens``: tokens to generate (at least one is always generated).
    """

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    hash_ids: tuple[int, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    output_token_ids: tuple[int, ...] | None = None
    parent: int | None = None
    think_s: float = 0.0

    def over_context(self, max_model_len: int | None) -> bool:
        """Whether prompt + output (at least one token) is longer than ``max_model_len``
        (None: no limit): vLLM's server refuses such a request."""
        return max_model_len is not None and \
            self.num_prompt_tokens + max(1, self.num_output_tokens) > max_model_len


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Requests in arrival order plus what is known about them.

    ``source_block_size``: tokens per ``hash_ids`` entry (None when no request has any).
    ``ideal_hit_rate``: the analytic infinite-cache, block-granular hit rate (generators;
    keyed by block size via :attr:`ideal_hit_rate_fn`), None for traces.
    ``hash_ids_local``: the ``hash_ids`` mean something only inside this workload's file
    (replayed together with other files, they are renamed apart).
    """

    name: str
    requests: tuple[SimRequest, ...]
    source_block_size: int | None = None
    num_skipped_lines: int = 0
    first_skipped_problem: str | None = None
    description: str = ""
    ideal_hit_rate_fn: Callable[[int, str], float] | None = None
    hash_ids_local: bool = False

    def ideal_hit_rate(self, block_size: int, mode: str) -> float | None:
        """The analytic ideal hit rate at ``block_size`` in ``mode`` ("engine" or
        "pure-cache"), or None when the workload has none (traces)."""
        fn = self.ideal_hit_rate_fn
        return None if fn is None else fn(block_size, mode)

    def limited(self, limit: int | None) -> Workload:
        """The first ``limit`` requests (all when None); the analytic ideal no longer
        applies to a cut workload and is dropped."""
        if limit is None or limit >= len(self.requests):
            return self
        if limit < 0:
            raise InvalidArgumentError(f"limit must be >= 0, got {limit}")
        return Workload(
            name=self.name,
            requests=self.requests[:limit],
            source_block_size=self.source_block_size,
            num_skipped_lines=self.num_skipped_lines,
            first_skipped_problem=self.first_skipped_problem,
            description=f"{self.description} (first {limit} requests)",
            ideal_hit_rate_fn=None,
            hash_ids_local=self.hash_ids_local,
        )


# ---------------------------------------------------------------- block hashes


def check_block_size(block_size: int, source_block_size: int | None) -> None:
    """Raise :class:`InvalidArgumentError` unless ``block_size`` divides, equals or is a
    multiple of ``source_block_size`` (any block size goes when there is no source)."""
    if not isinstance(block_size, int) or block_size <= 0:
        raise InvalidArgumentError(f"block size must be a positive int, got {block_size!r}")
    if source_block_size is None:
        return
    if source_block_size % block_size and block_size % source_block_size:
        raise InvalidArgumentError(
            f"block size {block_size} cannot replay a trace of {source_block_size}-token "
            f"hash blocks: use a divisor of {source_block_size} (e.g. 16, 64, 256) or a "
            "multiple of it"
        )


def request_block_hashes(
    request: SimRequest,
    block_size: int,
    *,
    source_block_size: int | None,
    index: int = 0,
    num_blocks: int | None = None,
) -> list[bytes] | None:
    """The block hashes of ``request``'s full prompt blocks at ``block_size`` (module
    docstring), or None when the manager should hash its token ids itself.

    ``index`` (the request's position in its workload) keys the unique hashes of
    length-only requests. ``num_blocks``: hash this many blocks instead of the full ones
    (reference semantics also hashes the partial last block; at most ``ceil(n / b)`` with
    ``b`` dividing the source block size). Pure; O(prompt blocks).
    """
    num_full = request.num_prompt_tokens // block_size if num_blocks is None else num_blocks
    ids = request.hash_ids
    if ids is None:
        if request.prompt_token_ids is not None:
            return None
        key = b"u" + index.to_bytes(8, "little")
        return [key + i.to_bytes(4, "little") for i in range(num_full)]
    assert source_block_size is not None
    sha = hashlib.sha256
    out: list[bytes] = []
    parent = _ROOT
    if block_size >= source_block_size:
        m = block_size // source_block_size
        for i, hid in enumerate(ids[: num_full * m]):
            parent = sha(parent + hid.to_bytes(8, "little")).digest()
            if (i + 1) % m == 0:
                out.append(parent)
        return out
    k = source_block_size // block_size
    suffix = _SUFFIX[:k]
    for hid in ids[: -(-num_full // k)]:
        parent = sha(parent + hid.to_bytes(8, "little")).digest()
        out.extend([parent + s for s in suffix])
    del out[num_full:]
    return out


# ---------------------------------------------------------------- loaders


def bundled_trace_path() -> Path:
    """Path of the bundled default trace (head of Mooncake's conversation trace)."""
    return Path(str(resources.files("pagedkv") / "data" / "traces" / _BUNDLED))
