"""The pure-Python kernels: the specification of every per-block loop of the core.

Each function here has exactly the signature of its compiled twin in
``pagedkv/_csrc`` (``pool_take``, ``pool_free``, ``pool_touch``, ``index_register``,
``longest_hit``, ``hash_plain``; the queue is :class:`~pagedkv.core.free_queue.FreeBlockQueue`,
the compiled ``FreeQueue``'s specification) and *is* its contract: the compiled kernel must
return the same value and leave every argument it mutates exactly as the function here
leaves it, for every input within the contract (tests/core/test_kernels_each.py checks each
pair on random inputs). :mod:`pagedkv.core.kernels` names them and picks a set.

Kernels do no argument checking beyond what their loops need: the pool, the index and the
hasher check the caller's arguments first and call a kernel only with valid ones.

>>> q = FreeBlockQueue(4, first_id=1); q.popleft_n(3)   # blocks 1..3 in use
[1, 2, 3]
>>> ref = [0, 1, 2, 1]
>>> pool_free(q, ref, [None, None, b"k", None], [1, 2, 3])   # 1 and 3 reach 0
>>> q.to_list(), ref
([1, 3], [0, 0, 1, 0])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from pagedkv.core.cbor import block_payloads, token_table
from pagedkv.core.free_queue import FreeBlockQueue

__all__ = [
    "CHUNK_TOKENS",
    "FreeBlockQueue",
    "PlainHasher",
    "hash_plain",
    "index_register",
    "longest_hit",
    "pool_free",
    "pool_take",
    "pool_touch",
]

#: Tokens :func:`hash_plain` encodes at a time (a cache-sized working set).
CHUNK_TOKENS = 1024


class PlainHasher(Protocol):
    """What :func:`hash_plain` needs of a :class:`~pagedkv.core.hashing.BlockHasher`."""

    seed: bytes

    def hash_payloads(self, hashes: list[bytes], payloads: list[Any]) -> None: ...


def pool_take(
    ids: list[int], ref_cnt: list[int], block_hash: list[Any], block_group: list[int],
    index: list[dict[bytes, int]], dups: list[dict[bytes, list[int]]],
    secondary: dict[int, Any], removed: Callable[[list[bytes], int], None],
    evict: Callable[[int], None], /,
) -> int:
    """The loop of ``BlockPool.get_new_blocks`` over ``ids``, just taken from the free queue.

    Each block gets ref count 1. A cached one (``block_hash[b]`` set) whose key has no
    duplicate (``dups[group]``) and no partial-prefix entry (``secondary``) leaves
    ``index[group]`` here and its hash is cleared; its hash is told to
    ``removed(hashes, group)`` in runs of consecutive blocks of one group (one call per
    run, in order). Any other cached one goes to ``evict(b)`` (after the pending run is
    told). Mutates ``ref_cnt``, ``block_hash``, ``index``; reads the rest.

    Returns:
        The number of blocks evicted here (``evict`` counts its own). O(len(ids)).

    >>> ref, bh, bg = [0, 0, 0], [None, b"a", None], [0, 0, 0]
    >>> index = [{b"a": 1}]
    >>> told = []
    >>> pool_take([2, 1], ref, bh, bg, index, [{}], {}, lambda h, g: told.append((h, g)),
    ...           told.append)
    1
    >>> ref, bh, index, told
    ([0, 1, 1], [None, None, None], [{}], [([b'a'], 0)])
    """
    # NOTE: blocks without a hash (freed uncached, never used) need only their ref count;
    # the eviction loop starts at the first hashed block, if any.
    for k, b in enumerate(ids):
        if block_hash[b] is not None:
            return _take_cached(ids, k, ref_cnt, block_hash, block_group, index, dups,
                                secondary, removed, evict)
        ref_cnt[b] = 1
    return 0


def _take_cached(
    ids: list[int], first: int, ref_cnt: list[int], block_hash: list[Any],
    block_group: list[int], index: list[dict[bytes, int]],
    dups: list[dict[bytes, list[int]]], secondary: dict[int, Any],
    removed: Callable[[list[bytes], int], None], evict: Callable[[int], None],
) -> int:
    """:func:`pool_take` from ``ids[first]`` (a cached block) on."""
    run: list[bytes] = []  # hashes evicted in group run_group, told in one call
    run_group = 0
    num_evicted = 0
    # NOTE: the common eviction (the block is the only block under its key and has no
    # partial-prefix keys) is inlined: one dict delete instead of two calls and three
    # lookups. A 64-block allocate evicting 64 cached blocks of a 1M-block pool:
    # 86 -> 54 us (benchmarks/ab_eviction.py, interleaved best of 200).
    for b in ids[first:] if first else ids:
        h = block_hash[b]
        if h is not None:
            g = block_group[b]
            dg = dups[g]
            if (not dg or h not in dg) and (not secondary or b not in secondary):
                del index[g][h]
                block_hash[b] = None
                num_evicted += 1
                if g != run_group and run:
                    removed(run, run_group)
                    run = []
                run_group = g
                run.append(h)
            else:
                if run:
                    removed(run, run_group)
                    run = []
                evict(b)
        ref_cnt[b] = 1
    if run:
        removed(run, run_group)
    return num_evicted


def pool_free(
    queue: FreeBlockQueue, ref_cnt: list[int], block_hash: list[Any], ordered: Iterable[int], /
) -> None:
    """The loop of ``BlockPool.free_blocks``: ref count -1 for each id of ``ordered``
    (0, the null block, skipped); those reaching 0 join ``queue``, the ones without a hash
    at the front and the ones with a hash at the back, each in ``ordered`` order (so the
    first of ``ordered`` is evicted first). Mutates ``ref_cnt`` and ``queue``. O(n).

    >>> q = FreeBlockQueue(5, first_id=1); q.popleft_n(4)
    [1, 2, 3, 4]
    >>> pool_free(q, [0, 1, 1, 1, 1], [None, b"x", None, b"y", None], [1, 2, 3, 4])
    >>> q.to_list()
    [2, 4, 1, 3]
    """
    hashed: list[int] = []
    unhashed: list[int] = []
    for b in ordered:
        if b:
            r = ref_cnt[b] - 1
            ref_cnt[b] = r
            if r == 0:
                if block_hash[b] is None:
                    unhashed.append(b)
                else:
                    hashed.append(b)
    if unhashed:
        queue.prepend_n(unhashed)
    if hashed:
        queue.append_n(hashed)


def pool_touch(queue: FreeBlockQueue, ref_cnt: list[int], ids: Iterable[int], /) -> None:
    """The loop of ``BlockPool.touch`` (a prefix hit): ref count +1 for each id of ``ids``
    (0 skipped); a block at 0 leaves ``queue`` first. Mutates ``ref_cnt`` and ``queue``.
    O(n).

    >>> q = FreeBlockQueue(3, first_id=1); ref = [0, 0, 0]
    >>> pool_touch(q, ref, [2, 0, 2]); ref, q.to_list()
    ([0, 0, 2], [1])
    """
    remove = queue.remove
    for b in ids:
        if b:
            if ref_cnt[b] == 0:
                remove(b)
            ref_cnt[b] += 1


def index_register(
    blocks: list[int], hashes: list[bytes], start: int, stop: int, index: dict[bytes, int],
    dups: dict[bytes, list[int]], block_hash: list[Any], block_group: list[int], group: int,
    evict: Callable[[int], None], /,
) -> list[int]:
    """The loop of ``PrefixIndex.cache_full_blocks`` (no mask) over positions
    ``[start, stop)`` of ``blocks``: a null block, or one already registered under
    ``hashes[i]`` in ``group``, is skipped; one registered under another key goes to
    ``evict(b)`` first; then it gets ``hashes[i]`` and ``group`` and joins ``index`` (this
    group's dict) as primary, or ``dups`` as a later duplicate. Mutates ``block_hash``,
    ``block_group``, ``index``, ``dups``.

    Returns:
        The skipped positions, ascending. O(stop - start).

    >>> index, dups, bh, bg = {b"a": 3}, {}, [None] * 4, [0] * 4
    >>> index_register([0, 2, 1], [b"z", b"a", b"b"], 0, 3, index, dups, bh, bg, 0, print)
    [0]
    >>> index, dups, bh
    ({b'a': 3, b'b': 1}, {b'a': [2]}, [None, b'b', b'a', None])
    """
    skipped: list[int] = []
    for i in range(start, stop):
        b = blocks[i]
        if not b:
            skipped.append(i)
            continue
        h = hashes[i]
        current = block_hash[b]
        if current is not None:
            if current == h and block_group[b] == group:
                skipped.append(i)
                continue
            evict(b)
        block_hash[b] = h
        block_group[b] = group
        if index.setdefault(h, b) != b:
            dups.setdefault(h, []).append(b)
    return skipped


def longest_hit(index: dict[bytes, int], hashes: list[bytes], n: int, /) -> list[int]:
    """Full attention's longest-hit probe: ``index[hashes[0]], index[hashes[1]], ...``
    for the first ``n`` hashes, up to the first one ``index`` does not hold. Mutates
    nothing. O(length of the hit + 1).

    >>> longest_hit({b"a": 4, b"b": 7, b"d": 9}, [b"a", b"b", b"c", b"d"], 4)
    [4, 7]
    """
    get = index.get
    out: list[int] = []
    for i in range(min(n, len(hashes))):
        b = get(hashes[i])
        if b is None:
            break
        out.append(b)
    return out


def hash_plain(
    hasher: PlainHasher, hashes: list[bytes], tokens: Sequence[int], start: int, stop: int,
    block_size: int, /,
) -> bool:
    """Append to ``hashes`` the chained hashes of the blocks of ``tokens`` in
    ``[start, stop)`` (multiples of ``block_size``) without extra keys: the first parent is
    ``hashes[-1]``, else ``hasher.seed``. Through the hasher's memo
    (``hasher.hash_payloads``), in chunks of :data:`CHUNK_TOKENS` tokens.

    Returns:
        True; False with ``hashes`` unchanged when a token is not an int in
        0 .. 2**17 - 1 or the parent is not a digest of the hasher (its length differs
        from the seed's): the caller then takes the checked path, which encodes any id
        or raises. O(stop - start).

    Raises:
        ValueError: the range is not ``0 <= start <= stop <= len(tokens)`` with
            ``stop - start`` a multiple of ``block_size > 0``.
    """
    if (block_size <= 0 or start < 0 or stop > len(tokens) or start > stop
            or (stop - start) % block_size):
        raise ValueError("hash_plain: bad block range")
    parent = hashes[-1] if hashes else hasher.seed
    if len(parent) != len(hasher.seed):
        return False
    table = token_table()
    num_before = len(hashes)
    chunk = max(1, CHUNK_TOKENS // block_size) * block_size
    try:
        for c in range(start, stop, chunk):
            hasher.hash_payloads(hashes, block_payloads(tokens[c : min(c + chunk, stop)],
                                                        block_size, table))
    except (IndexError, TypeError):
        del hashes[num_before:]  # an id outside the table: nothing changed
        return False
    return True
