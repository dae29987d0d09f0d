"""The kernels interface: every per-block loop of the core, as one set picked once.

A *kernel* is one hot loop of the core as a plain function (or, for the free queue, a
class) over lists, dicts and callbacks: no object of the core, no checks of the caller's
arguments (the pool, the index and the hasher check them first). Each has a pure-Python
implementation in :mod:`pagedkv.core.kernels_pure`, which is its specification, and may
have a compiled one in ``pagedkv.core._ccore`` (``pagedkv/_csrc``) with the same
signature and the same effect. A :class:`Kernels` record names one implementation of
each; :data:`PURE` is the pure set, :data:`COMPILED` the compiled set (``None`` when the
extension is not built or ``PAGEDKV_PURE`` is set), and :func:`kernels` the set for an
object being built now. Objects take their kernels once, at construction, and call them
unconditionally: no call site tests which core it runs.

The contracts, in one line each (details and worked examples on the pure functions):

=================  ==============================================================
``queue_class``    the free queue: ``(num_blocks, *, first_id)``, popleft_n, remove,
                   append_n, prepend_n, to_list, ... (:class:`FreeBlockQueue`)
``pool_take``      ref count 1 for each taken id; evict the cached ones; -> number
                   evicted inline
``pool_free``      ref count -1; those at 0 queued, unhashed front, hashed back
``pool_touch``     ref count +1; those at 0 leave the queue first
``index_register`` register ``blocks[start:stop]`` under ``hashes``; -> skipped positions
``longest_hit``    the blocks of the longest run of ``hashes`` the dict holds
``hash_plain``     chained block hashes without extra keys; False: not done, unchanged
``hash_keyed``     the same for blocks with encoded extra keys (``None`` in the pure set:
                   the hasher's memo path is its Python form)
``window_hit``     a sliding-window group's longest hit (right to left)
``chunk_hit``      a chunked-local group's longest hit
``state_hit``      a Mamba align group's hit (the last cached state)
``admit_groups``   a new request's allocation in every group at once; ``None``: refused
``record_stored``  one stored event of a registered run (the event recorder's record)
``extra_tails``    the encoded extra keys of a request's new blocks; ``None``: not
                   covered (the compiled one: prompt embeddings)
``mamba_release``  a Mamba align group's release of the states behind the live one
``mamba_grow``     a Mamba align group's growth to its live position
``free_groups``    a request's free in every group that frees by the base rule
``hybrid_hit``     a coordinator's whole lookup (every group, the fixed point)
``lookup_request`` a façade's lookup after its checks: found, counted, the hit built
``start_request``  a new request's prompt checked, copied and hashed (``None`` in the
                   pure set: the request's checked path is its Python form)
``extend_request`` the blocks a request's growth filled, hashed (``None`` in the pure
                   set: ``BlockHasher.extend`` is its Python form)
=================  ==============================================================

Those from ``window_hit`` to ``lookup_request`` are the hybrid path's; their pure
implementations are in :mod:`pagedkv.core.kernels_hybrid`,
:mod:`pagedkv.core.kernels_hybrid_lookup`, :mod:`pagedkv.core.kernels_hybrid_step` and
:mod:`pagedkv.core.kernels_hybrid_hits`. The request kernels' specifications are in
:mod:`pagedkv.core.kernels_request`.

>>> kernels() in (PURE, COMPILED)
True
>>> with native.forced_pure():
...     kernels() is PURE
True
>>> PURE.longest_hit({b"a": 4}, [b"a", b"b"], 2)
[4]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pagedkv.core import (
    kernels_hybrid,
    kernels_hybrid_hits,
    kernels_hybrid_lookup,
    kernels_hybrid_step,
    kernels_pure,
    kernels_request,
    native,
)
from pagedkv.core.free_queue import FreeBlockQueue
from pagedkv.core.kernels_pure import PlainHasher

__all__ = ["COMPILED", "PURE", "Kernels", "kernels"]

#: ``pool_take(ids, ref_cnt, block_hash, block_group, index, dups, secondary, removed,
#: evict) -> int``.
PoolTake = Callable[
    [list[int], list[int], list[Any], list[int], list[dict[bytes, int]],
     list[dict[bytes, list[int]]], dict[int, Any], Callable[[list[bytes], int], None],
     Callable[[int], None]],
    int,
]
#: ``pool_free(queue, ref_cnt, block_hash, ordered) -> None``.
PoolFree = Callable[[FreeBlockQueue, list[int], list[Any], Iterable[int]], None]
#: ``pool_touch(queue, ref_cnt, ids) -> None``.
PoolTouch = Callable[[FreeBlockQueue, list[int], Iterable[int]], None]
#: ``index_register(blocks, hashes, start, stop, index, dups, block_hash, block_group,
#: group, evict) -> list[int]``.
IndexRegister = Callable[
    [list[int], list[bytes], int, int, dict[bytes, int], dict[bytes, list[int]], list[Any],
     list[int], int, Callable[[int], None]],
    list[int],
]
#: ``longest_hit(index, hashes, n) -> list[int]``.
LongestHit = Callable[[dict[bytes, int], list[bytes], int], list[int]]
#: ``hash_plain(hasher, hashes, tokens, start, stop, block_size) -> bool``.
HashPlain = Callable[[PlainHasher, list[bytes], Sequence[int], int, int, int], bool]


@dataclass(frozen=True, slots=True)
class Kernels:
    """One implementation of each kernel (module docstring). Frozen: a set never changes.

    Arguments marked *list* must be exact lists: the compiled kernels take nothing else
    (the call sites pass request block tables, ``block_hashes`` and the pool's per-block
    lists, all lists by construction); ``hash_plain`` and ``hash_keyed`` take any sequence
    of tokens (the compiled ones read a list or tuple in place).
    """

    #: ``"pure"`` or ``"compiled"``.
    name: str
    #: The free queue class: ``queue_class(num_blocks, first_id=1)`` holds blocks
    #: ``first_id .. num_blocks - 1`` in order (:class:`FreeBlockQueue` is the spec).
    queue_class: Callable[..., FreeBlockQueue]
    #: :func:`pagedkv.core.kernels_pure.pool_take`: mutates ref_cnt, block_hash, index.
    pool_take: PoolTake
    #: :func:`pagedkv.core.kernels_pure.pool_free`: mutates the queue (of
    #: ``queue_class``) and ref_cnt.
    pool_free: PoolFree
    #: :func:`pagedkv.core.kernels_pure.pool_touch`: mutates the queue and ref_cnt.
    pool_touch: PoolTouch
    #: :func:`pagedkv.core.kernels_pure.index_register`: mutates the index, dups,
    #: block_hash, block_group.
    index_register: IndexRegister
    #: :func:`pagedkv.core.kernels_pure.longest_hit`: mutates nothing.
    longest_hit: LongestHit
    #: :func:`pagedkv.core.kernels_pure.hash_plain` (SHA-256 over canonical CBOR; the
    #: pure one also any other algorithm): mutates hashes.
    hash_plain: HashPlain
    #: :func:`pagedkv.core.kernels_hybrid.hash_keyed` (its specification; ``None`` in the
    #: pure set): mutates hashes.
    hash_keyed: kernels_hybrid.HashKeyed | None
    #: :func:`pagedkv.core.kernels_hybrid.window_hit`: mutates nothing.
    window_hit: Callable[..., list[int]]
    #: :func:`pagedkv.core.kernels_hybrid.chunk_hit`: mutates nothing.
    chunk_hit: Callable[..., list[int]]
    #: :func:`pagedkv.core.kernels_hybrid.state_hit`: mutates nothing.
    state_hit: Callable[..., list[int]]
    #: :func:`pagedkv.core.kernels_hybrid.admit_groups`: mutates the tables and counts
    #: of its plan, through the pool's touch and take.
    admit_groups: Callable[..., Any]
    #: :func:`pagedkv.core.kernels_hybrid.record_stored`: appends to the event list.
    record_stored: Callable[..., Any]
    #: :func:`pagedkv.core.kernels_hybrid_lookup.extra_tails`: appends to keys_out.
    extra_tails: kernels_hybrid_lookup.ExtraTails
    #: :func:`pagedkv.core.kernels_hybrid_step.mamba_release`: mutates the table and
    #: ``released``, through the pool's free.
    mamba_release: Callable[..., None]
    #: :func:`pagedkv.core.kernels_hybrid_step.mamba_grow`: mutates the table,
    #: ``last_state`` and ``allocated``, through the pool's take.
    mamba_grow: Callable[..., list[int]]
    #: :func:`pagedkv.core.kernels_hybrid_step.free_groups`: mutates the plan's
    #: containers, through the pool's free.
    free_groups: Callable[..., None]
    #: :func:`pagedkv.core.kernels_hybrid_hits.hybrid_hit`: a coordinator's whole lookup
    #: over its plan (the compiled one is the type ``HybridHit``); mutates nothing.
    hybrid_hit: Callable[..., kernels_hybrid_hits.HitFinder]
    #: :func:`pagedkv.core.kernels_hybrid_hits.lookup_request`: mutates the lookup
    #: statistics.
    lookup_request: Callable[..., Any]
    #: :func:`pagedkv.core.kernels_request.start_request` (its specification; ``None`` in
    #: the pure set): mutates hashes and keys_out.
    start_request: kernels_request.StartRequest | None
    #: :func:`pagedkv.core.kernels_request.extend_request` (its specification; ``None``
    #: in the pure set): mutates hashes and keys_out.
    extend_request: kernels_request.ExtendRequest | None

    def for_queue(self, queue: object) -> Kernels:
        """The set whose ``pool_free`` and ``pool_touch`` take ``queue``: this one when
        ``queue`` is of its ``queue_class``, else :data:`PURE` (a retention policy's own
        queue). O(1).

        >>> PURE.for_queue(FreeBlockQueue(2)) is PURE
        True
        """
        return self if type(queue) is self.queue_class else PURE

    def __reduce__(self) -> tuple[Callable[[str], Kernels], tuple[str]]:
        """Pickled by name: a copied pool or hasher gets this process's set."""
        return _by_name, (self.name,)


def _by_name(name: str) -> Kernels:
    """:data:`PURE` or :data:`COMPILED` by name (the pure set when none is built)."""
    return COMPILED if name == "compiled" and COMPILED is not None else PURE


#: Every kernel once: its field, its pure implementation (``None``: none, the caller's
#: Python path is its form), and the name of its compiled twin in ``_ccore``. Both sets
#: are built from this one table.
_TABLE: tuple[tuple[str, object, str], ...] = (
    ("queue_class", FreeBlockQueue, "FreeQueue"),
    ("pool_take", kernels_pure.pool_take, "pool_take"),
    ("pool_free", kernels_pure.pool_free, "pool_free"),
    ("pool_touch", kernels_pure.pool_touch, "pool_touch"),
    ("index_register", kernels_pure.index_register, "index_register"),
    ("longest_hit", kernels_pure.longest_hit, "longest_hit"),
    ("hash_plain", kernels_pure.hash_plain, "hash_plain"),
    ("hash_keyed", None, "hash_keyed"),
    ("window_hit", kernels_hybrid.window_hit, "window_hit"),
    ("chunk_hit", kernels_hybrid.chunk_hit, "chunk_hit"),
    ("state_hit", kernels_hybrid.state_hit, "state_hit"),
    ("admit_groups", kernels_hybrid.admit_groups, "admit_groups"),
    ("record_stored", kernels_hybrid.record_stored, "record_stored"),
    # the hybrid request's hashing extras and lookup (kernels_hybrid_lookup)
    ("extra_tails", kernels_hybrid_lookup.extra_tails, "extra_tails"),
    ("mamba_release", kernels_hybrid_step.mamba_release, "mamba_release"),
    ("mamba_grow", kernels_hybrid_step.mamba_grow, "mamba_grow"),
    ("free_groups", kernels_hybrid_step.free_groups, "free_groups"),
    ("hybrid_hit", kernels_hybrid_hits.hybrid_hit, "HybridHit"),
    ("lookup_request", kernels_hybrid_hits.lookup_request, "lookup_request"),
    # a new request's prompt (kernels_request)
    ("start_request", None, "start_request"),
    ("extend_request", None, "extend_request"),
)

_pure_impls: dict[str, Any] = {field: pure for field, pure, _ in _TABLE}
PURE = Kernels("pure", **_pure_impls)


def _compiled(ccore: ModuleType) -> Kernels:
    """The compiled set over the extension module ``ccore``: each kernel its
    ``_ccore`` attribute, called directly (no Python wrapper)."""
    impls: dict[str, Any] = {field: getattr(ccore, name) for field, _, name in _TABLE}
    return Kernels("compiled", **impls)


_module = native.module()
#: The compiled set, or ``None`` when ``native.IMPORT_ERROR`` says why not.
COMPILED: Kernels | None = None if _module is None else _compiled(_module)


def kernels() -> Kernels:
    """The set for an object being built now: :data:`COMPILED` when available, else (or
    inside :func:`pagedkv.core.native.forced_pure`, or with ``PAGEDKV_PURE=1``)
    :data:`PURE`. O(1)."""
    return PURE if COMPILED is None or native.active() is None else COMPILED
