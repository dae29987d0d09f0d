"""Each compiled kernel against its pure specification, alone (pagedkv.core.kernels).

Hypothesis draws inputs within each kernel's contract (pool states with duplicates and
partial-prefix entries, free queues in any order, index dicts, hash lists, token lists
with ids outside the fast table); both kernels run on their own copies of the same input,
and the return value, every structure the kernel may mutate and every call back are
compared. The whole-manager differential machine (test_kernels_differential.py) checks
the kernels in place; this file pins a disagreement to one kernel.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.core import native
from pagedkv.core.free_queue import FreeBlockQueue
from pagedkv.core.hashing import BlockHasher
from pagedkv.core.kernels import COMPILED, PURE, Kernels
from pagedkv.core.prefix_index import PrefixIndex
from pagedkv.core.recorder import EventRecorder, GroupInfo

pytestmark = pytest.mark.skipif(
    COMPILED is None, reason=f"no compiled kernels to compare: {native.IMPORT_ERROR}")

KEYS = [bytes([k]) * 4 for k in range(6)]  # few keys: duplicates are common
FAST = settings(max_examples=150, deadline=None)


def _compiled() -> Kernels:
    assert COMPILED is not None
    return COMPILED


@dataclass
class IndexState:
    """A prefix index as the kernels see it, with the log of the calls back."""

    block_hash: list[Any]
    block_group: list[int]
    index: list[dict[bytes, int]]
    dups: list[dict[bytes, list[int]]]
    secondary: dict[int, list[tuple[int, bytes]]]
    ref_cnt: list[int]
    log: list[Any] = field(default_factory=list)

    def removed(self, hashes: list[bytes], group: int) -> None:
        self.log.append(("removed", list(hashes), group))

    def evict(self, b: int) -> None:
        """The pool's evict callback on this state: the real
        :meth:`PrefixIndex.evict_block` over these lists (its removals told to
        :meth:`removed`)."""
        self.log.append(("evict", b))
        groups = [GroupInfo(4, None, None)] * len(self.index)
        prefix = PrefixIndex(len(self.ref_cnt), enable_caching=True, hash_block_size=4,
                             groups=groups, recorder=None, policy=None, ref_cnt=self.ref_cnt,
                             kernels=PURE)
        prefix.block_hash, prefix.block_group = self.block_hash, self.block_group
        prefix.index, prefix.duplicates, prefix.secondary = self.index, self.dups, self.secondary
        prefix.recorder = cast(EventRecorder, self)
        prefix.evict_block(b)

    def register(self, b: int, g: int, h: bytes) -> None:
        if self.index[g].setdefault(h, b) != b:
            self.dups[g].setdefault(h, []).append(b)


@st.composite
def index_states(draw: st.DrawFn) -> IndexState:
    """A consistent index over 2..24 blocks and 1..3 groups (block 0 the null block)."""
    n = draw(st.integers(2, 24))
    groups = draw(st.integers(1, 3))
    s = IndexState([None] * n, [0] * n, [{} for _ in range(groups)],
                   [{} for _ in range(groups)], {}, [0] * n)
    order = draw(st.permutations(range(1, n)))
    for b in order:
        if draw(st.booleans()):
            g = draw(st.integers(0, groups - 1))
            h = draw(st.sampled_from(KEYS))
            s.block_hash[b], s.block_group[b] = h, g
            s.register(b, g, h)
            if draw(st.integers(0, 4)) == 0:  # a partial-prefix (secondary) key
                g2 = draw(st.integers(0, groups - 1))
                h2 = draw(st.sampled_from([k for k in KEYS if k != h]))
                s.secondary[b] = [(g2, h2)]
                s.register(b, g2, h2)
    return s


def _same(a: IndexState, b: IndexState) -> None:
    assert a == b  # every field, the log of calls back included


@FAST
@given(index_states(), st.data())
def test_pool_take(state: IndexState, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(1, len(state.ref_cnt) - 1), unique=True))
    results = []
    for k in (PURE, _compiled()):
        s = copy.deepcopy(state)
        n = k.pool_take(list(ids), s.ref_cnt, s.block_hash, s.block_group, s.index, s.dups,
                        s.secondary, s.removed, s.evict)
        results.append((n, s))
    assert results[0][0] == results[1][0]
    _same(results[0][1], results[1][1])


@FAST
@given(index_states(), st.data())
def test_index_register(state: IndexState, data: st.DataObject) -> None:
    n = len(state.ref_cnt)
    blocks = data.draw(st.lists(st.integers(0, n - 1), max_size=12).map(
        lambda xs: [x for i, x in enumerate(xs) if not x or x not in xs[:i]]))
    hashes = data.draw(st.lists(st.sampled_from(KEYS), min_size=len(blocks),
                                max_size=len(blocks)))
    start = data.draw(st.integers(0, len(blocks)))
    stop = data.draw(st.integers(start, len(blocks)))
    group = data.draw(st.integers(0, len(state.index) - 1))
    results = []
    for k in (PURE, _compiled()):
        s = copy.deepcopy(state)
        skipped = k.index_register(list(blocks), list(hashes), start, stop, s.index[group],
                                   s.dups[group], s.block_hash, s.block_group, group, s.evict)
        results.append((skipped, s))
    assert results[0][0] == results[1][0]
    _same(results[0][1], results[1][1])


@st.composite
def queue_states(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[Any]]:
    """(num_blocks, queue order, ref counts, block hashes): a free queue in any order,
    ref count 0 exactly for the queued blocks."""
    n = draw(st.integers(2, 24))
    queued = draw(st.lists(st.integers(1, n - 1), unique=True))
    ref = [0] + [0 if b in queued else draw(st.integers(1, 3)) for b in range(1, n)]
    bh = [None] + [draw(st.sampled_from([None, *KEYS[:2]])) for _ in range(1, n)]
    return n, queued, ref, bh


def _queue(k: Kernels, n: int, order: list[int]) -> FreeBlockQueue:
    q = k.queue_class(n, first_id=1)
    q.popleft_n(n - 1)
    q.append_n(order)
    return q


@FAST
@given(queue_states(), st.data())
def test_pool_free(state: tuple[int, list[int], list[int], list[Any]],
                   data: st.DataObject) -> None:
    n, order, ref, bh = state
    held = [b for b in range(1, n) for _ in range(ref[b])]  # each reference once
    ordered = data.draw(st.permutations(held).flatmap(
        lambda p: st.integers(0, len(p)).map(lambda m: [*p[:m], 0])))
    outs = []
    for k in (PURE, _compiled()):
        q, r = _queue(k, n, order), list(ref)
        k.pool_free(q, r, list(bh), list(ordered))
        outs.append((r, q.to_list(), q.num_free, q.check_invariants()))
    assert outs[0] == outs[1]


@FAST
@given(queue_states(), st.data())
def test_pool_touch(state: tuple[int, list[int], list[int], list[Any]],
                    data: st.DataObject) -> None:
    n, order, ref, _ = state
    ids = data.draw(st.lists(st.integers(0, n - 1), max_size=12))
    outs = []
    for k in (PURE, _compiled()):
        q, r = _queue(k, n, order), list(ref)
        k.pool_touch(q, r, iter(ids))  # any iterable
        outs.append((r, q.to_list(), q.num_free))
    assert outs[0] == outs[1]


OPS = st.lists(st.tuples(st.sampled_from(["popleft", "popleft_n", "remove", "append",
                                          "append_n", "prepend_n"]),
                         st.integers(0, 30)), max_size=30)


@FAST
@given(st.integers(2, 24), OPS)
def test_free_queue(n: int, ops: list[tuple[str, int]]) -> None:
    queues = [PURE.queue_class(n, first_id=1), _compiled().queue_class(n, first_id=1)]
    out: list[list[Any]] = [[], []]
    for op, x in ops:
        for i, q in enumerate(queues):
            inside = q.to_list()
            outside = [b for b in range(1, n) if b not in inside]
            if op == "popleft" and inside:
                out[i].append(q.popleft())
            elif op == "popleft_n":
                out[i].append(q.popleft_n(x % (len(inside) + 1)))
            elif op == "remove" and inside:
                q.remove(inside[x % len(inside)])
            elif op in ("append", "append_n", "prepend_n") and outside:
                some = outside[: 1 + x % len(outside)]
                if op == "append":
                    q.append(some[0])
                else:
                    getattr(q, op)(some)
            out[i].append((q.to_list(), q.num_free, list(q), q.check_invariants()))
    assert out[0] == out[1]
    with pytest.raises(IndexError):
        queues[1].append(n)  # outside the pool: refused, never written


@FAST
@given(st.dictionaries(st.sampled_from(KEYS), st.integers(1, 9)),
       st.lists(st.sampled_from(KEYS), max_size=8), st.integers(-2, 10))
def test_longest_hit(index: dict[bytes, int], hashes: list[bytes], n: int) -> None:
    assert PURE.longest_hit(dict(index), list(hashes), n) == _compiled().longest_hit(
        dict(index), list(hashes), n)


TOKENS = st.one_of(st.integers(0, 300), st.integers(0, 2**17 - 1), st.just(2**17 + 3))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.sampled_from([0, 64]), st.lists(TOKENS, max_size=40),
       st.integers(0, 2), st.data())
def test_hash_plain(bs: int, memo: int, tokens: list[int], parent: int,
                    data: st.DataObject) -> None:
    hasher = BlockHasher(bs, memo_blocks=memo)
    first: list[bytes] = [[], [hasher.hash_block(hasher.seed, [1] * bs)], [b"short"]][parent]
    num_blocks = len(tokens) // bs
    start = data.draw(st.integers(0, num_blocks)) * bs
    stop = data.draw(st.integers(start // bs, num_blocks)) * bs
    outs = []
    for k in (PURE, _compiled()):
        hashes = list(first)
        done = k.hash_plain(hasher, hashes, list(tokens), start, stop, bs)
        outs.append((done, hashes))
    assert outs[0] == outs[1]
    assert outs[0][0] == (parent != 2 and all(t < 2**17 for t in tokens[start:stop]))


def test_hash_plain_takes_any_sequence_and_rejects_a_bad_range() -> None:
    hasher = BlockHasher(2)
    for k in (PURE, _compiled()):
        a: list[bytes] = []
        b: list[bytes] = []
        assert k.hash_plain(hasher, a, [1, 2, 3, 4], 0, 4, 2)
        assert k.hash_plain(hasher, b, (1, 2, 3, 4), 0, 4, 2)  # a tuple, read in place
        c: list[bytes] = []
        assert k.hash_plain(hasher, c, range(1, 5), 0, 4, 2)  # any other sequence
        assert a == b == c and len(a) == 2
        with pytest.raises(ValueError, match="bad block range"):
            k.hash_plain(hasher, [], [1, 2, 3], 0, 3, 2)


def test_the_sets_differ_only_in_implementation() -> None:
    names = [f for f in Kernels.__dataclass_fields__ if f != "name"]
    compiled = _compiled()
    for name in names:
        pure_k: Callable[..., Any] = getattr(PURE, name)
        assert getattr(compiled, name) is not pure_k, name
    assert compiled.for_queue(FreeBlockQueue(3)) is PURE
    assert compiled.for_queue(compiled.queue_class(3)) is compiled
