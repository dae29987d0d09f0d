"""Upper bounds on the prefix-cache hit rate of a workload: the infinite-cache ceiling and
the offline-optimal (Belady) hit rate at a given capacity.

**The setting** is pure-cache mode (:mod:`pagedkv.sim.pure_cache`) at block size ``b``.
Request ``i`` (``n_i`` prompt tokens, full-block hashes ``h_1..h_s``, ``s = floor(n_i/b)``)
*queries* its first ``q = floor((n_i - 1) / b)`` blocks (a hit covers at most ``n_i - 1``
tokens) and then *stores* all ``s`` (``s = q + 1`` exactly when ``b`` divides ``n_i``).
Flattened, the workload is a sequence of block accesses, each *counted* (a query) or not
(the one stored-only block).

**Infinite ceiling**: every stored block stays forever; request ``i`` hits the longest
prefix of its queried blocks stored by an earlier request. No policy at any capacity can
hit more (a block can only be hit if some earlier request stored it).

**Belady bound at capacity C blocks**: the most counted accesses that *any* policy holding
at most ``C`` blocks can hit on this sequence — even one that knows the future, may decline
to keep a block (bypass), may evict a request's own earlier blocks while it is still being
stored, and counts a hit on a block even when an earlier block of the same request missed.
Each relaxation only helps, so the bound is >= the hit rate of pagedkv's LRU in pure-cache
mode at ``C`` blocks (which holds a whole request at once and hits only prefixes), and <=
the infinite ceiling. It is computed exactly by Belady's MIN with bypass: after each access,
keep the ``C`` blocks whose next *useful* access comes soonest, where a block whose next
access is a stored-only one has no useful next access (it is re-stored there for free; the
"epoch" argument: splitting a block at its uncounted accesses turns the problem into plain
caching with bypass, where MIN is optimal). Cost: O(accesses * log C).

In engine mode the same figures are shown beside the achieved hit rate as a *reference*,
computed on the requests the engine admitted (not the rejected ones) and with the blocks
each request fills while decoding stored too (``with_outputs``: a multi-turn reply
reappears in the next prompt). They say what a different eviction policy or more memory
could win with requests served one at a time in arrival order; they are not a proof about
the concurrent engine, whose running requests pin blocks and whose chunked prefills store
blocks later than the relaxation does.

Block identities: trace blocks get ints from the chain of ``(parent, hash_id)`` (sub-block
``j`` of source block ``B`` is ``B * k + j``, the same identity as the derived hashes of
:func:`pagedkv.sim.workloads.request_block_hashes`); other requests are hashed as the
manager would hash them (SHA-256 over their tokens) and numbered by digest.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from pagedkv import BlockHasher
from pagedkv.sim.semantics import Semantics, get_semantics
from pagedkv.sim.workloads import Workload, request_block_hashes

__all__ = [
    "AccessSequence",
    "BoundResult",
    "access_sequence",
    "belady_hits",
    "infinite_cache_hits",
]

_NEVER = 1 << 62


@dataclass(slots=True, kw_only=True)
class AccessSequence:
    """The flattened pure-cache access sequence of a workload at one block size.

    Request ``i`` accesses ``items[starts[i]:starts[i+1]]`` (its stored blocks in order);
    the first ``num_queried[i]`` of them are counted. Block identities are dense:
    ``0 <= item < num_ids`` (so per-block state fits flat arrays, 8 bytes a block).
    """

    block_size: int
    items: array[int]
    starts: list[int]
    num_queried: list[int]
    query_tokens: list[int]
    #: Tokens a hit on request ``i``'s last queried block credits (``block_size`` unless
    #: reference semantics makes it a partial block); None = all ``block_size``.
    tail_tokens: list[int] | None = None
    num_ids: int = 0
    _next_use: array[int] | None = None

    def credit(self, i: int, num_hit_blocks: int, last_hit: bool) -> int:
        """Tokens credited to request ``i`` for ``num_hit_blocks`` hit blocks, of which
        the last queried one is among them when ``last_hit``."""
        bs = self.block_size
        if not last_hit or self.tail_tokens is None:
            return num_hit_blocks * bs
        return (num_hit_blocks - 1) * bs + self.tail_tokens[i]

    @property
    def num_requests(self) -> int:
        return len(self.num_queried)

    def next_use(self) -> array[int]:
        """Per access, the position of the item's next access if that one is counted,
        else a sentinel larger than any position. Cached; O(accesses)."""
        if self._next_use is None:
            items = self.items
            counted = bytearray(len(items))
            for i, start in enumerate(self.starts[:-1]):
                counted[start : start + self.num_queried[i]] = b"\x01" * self.num_queried[i]
            nxt = array("q", [_NEVER]) * len(items)
            last = array("q", [-1]) * self.num_ids
            for p in range(len(items) - 1, -1, -1):
                x = items[p]
                j = last[x]
                if j >= 0 and counted[j]:
                    nxt[p] = j
                last[x] = p
            self._next_use = nxt
        return self._next_use


@dataclass(frozen=True, slots=True, kw_only=True)
class BoundResult:
    """Hit tokens per request under a bound; ``capacity_blocks`` None = infinite."""

    capacity_blocks: int | None
    hit_tokens: list[int]
    query_tokens: list[int]

    def hit_rate(self, start: int = 0) -> float:
        """Hit tokens / prompt tokens over requests ``start..``."""
        q = sum(self.query_tokens[start:])
        return sum(self.hit_tokens[start:]) / q if q else 0.0


def access_sequence(
    workload: Workload,
    block_size: int,
    *,
    with_outputs: bool = False,
    indices: Sequence[int] | None = None,
    semantics: str | Semantics = "vllm",
) -> AccessSequence:
    """Build the access sequence of ``workload`` at ``block_size``. O(total blocks).

    ``with_outputs``: each request also stores, uncounted, the full blocks it fills while
    decoding (prompt + all output tokens but the last), as engine mode does. Only requests
    with real output tokens (generators) have such blocks others can hit; trace requests'
    decode tokens are unique placeholders and are left out. ``indices``: only these
    requests, in this order (engine mode leaves out the requests it rejected).
    ``semantics``: which blocks are stored and queried (:mod:`pagedkv.sim.semantics`).
    """
    sem = get_semantics(semantics)
    sem.check(workload, block_size)
    reference = sem.name != "vllm"
    tails: list[int] | None = [] if reference else None
    src = workload.source_block_size
    order = range(len(workload.requests)) if indices is None else indices
    chain: dict[tuple[int, int], int] = {}
    digests: dict[bytes, int] = {}
    hasher: BlockHasher | None = None
    items = array("q")
    starts = [0]
    num_queried: list[int] = []
    for index in order:
        r = workload.requests[index]
        n = r.num_prompt_tokens
        s = sem.num_stored_blocks(n, block_size)
        num_queried.append(sem.num_queried_blocks(n, block_size))
        if tails is not None:
            tails.append(sem.tail_tokens(n, block_size))
        if r.hash_ids is not None:
            assert src is not None
            parent = -1
            nodes: list[int] = []
            need = s * block_size // src if block_size >= src else -(-s * block_size // src)
            for hid in r.hash_ids[:need]:
                key = (parent, hid)
                node = chain.get(key)
                if node is None:
                    node = chain[key] = len(chain)
                nodes.append(node)
                parent = node
            if block_size >= src:
                m = block_size // src
                items.extend(nodes[m - 1 :: m])
            else:
                k = src // block_size
                start = len(items)
                for node in nodes:
                    items.extend(range(node * k, node * k + k))
                del items[start + s :]
        else:
            hashes = request_block_hashes(r, block_size, source_block_size=src, index=index,
                                          num_blocks=s if reference else None)
            if hashes is None:
                assert r.prompt_token_ids is not None
                if hasher is None:
                    hasher = BlockHasher(block_size)
                hashes = []
                tokens = r.prompt_token_ids
                outs = r.output_token_ids
                if with_outputs and outs:
                    tokens = tokens + outs[: max(1, r.num_output_tokens) - 1]
                hasher.extend(hashes, tokens)
            for h in hashes:
                v = digests.get(h)
                if v is None:
                    v = digests[h] = -1 - len(digests)
                items.append(v)
        starts.append(len(items))
    chain_ids = len(chain) * (src // block_size if src and block_size < src else 1)
    if digests:  # digest identities were numbered -1, -2, ...: move them past the chain's
        for p, x in enumerate(items):
            if x < 0:
                items[p] = chain_ids - 1 - x
    return AccessSequence(
        block_size=block_size, items=items, starts=starts, num_queried=num_queried,
        num_ids=chain_ids + len(digests),
        query_tokens=[workload.requests[i].num_prompt_tokens for i in order],
        tail_tokens=tails,
    )


def infinite_cache_hits(seq: AccessSequence) -> BoundResult:
    """Hit tokens per request with a cache that never evicts. O(accesses)."""
    seen = bytearray(seq.num_ids)
    items = seq.items
    starts = seq.starts
    out: list[int] = []
    for i, q in enumerate(seq.num_queried):
        a = starts[i]
        h = 0
        while h < q and seen[items[a + h]]:
            h += 1
        out.append(seq.credit(i, h, h == q and h > 0))
        for p in range(a, starts[i + 1]):
            seen[items[p]] = 1
    return BoundResult(capacity_blocks=None, hit_tokens=out, query_tokens=seq.query_tokens)


def belady_hits(seq: AccessSequence, capacity_blocks: int) -> BoundResult:
    """Hit tokens per request under Belady's MIN with bypass at ``capacity_blocks``
    (module docstring). O(accesses * log capacity)."""
    nxt = seq.next_use()
    items = seq.items
    starts = seq.starts
    bs = seq.block_size
    cap = max(0, capacity_blocks)
    cache: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    push = heapq.heappush
    pop = heapq.heappop
    out: list[int] = []
    for i, q in enumerate(seq.num_queried):
        a = starts[i]
        hits = 0
        last_hit = False
        for p in range(a, starts[i + 1]):
            x = items[p]
            nu = nxt[p]
            if x in cache:
                if p - a < q:
                    hits += 1
                    last_hit = p - a == q - 1
                if nu == _NEVER:
                    del cache[x]
                else:
                    cache[x] = nu
                    push(heap, (-nu, x))
            elif nu != _NEVER and cap:
                if len(cache) < cap:
                    cache[x] = nu
                    push(heap, (-nu, x))
                    continue
                while True:  # drop stale heap entries to find the farthest cached block
                    neg, y = heap[0]
                    if cache.get(y) == -neg:
                        break
                    pop(heap)
                if -neg > nu:
                    pop(heap)
                    del cache[y]
                    cache[x] = nu
                    push(heap, (-nu, x))
        if len(heap) > 4 * cap + 1024:
            heap = [(-u, y) for y, u in cache.items()]
            heapq.heapify(heap)
        out.append(seq.credit(i, hits, last_hit) if last_hit else hits * bs)
    return BoundResult(capacity_blocks=capacity_blocks, hit_tokens=out,
                       query_tokens=seq.query_tokens)
