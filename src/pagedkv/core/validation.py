"""Checks at the façade boundary: a misused call raises before any state changes.

Each entry point of :class:`~pagedkv.KVCacheManager` calls one function here, except
``allocate_slots``, whose rule lives with it in :mod:`pagedkv.core.facade_allocation`
(the cheap pre-test of the common call and the full check, one module).

Rules (every violation raises the exception named, state unchanged):

* request ids are ``str`` and unique among *live* requests (those holding blocks):
  :class:`~pagedkv.errors.DuplicateRequestError` for a second request object with a live id;
* a request that holds no blocks (new, or freed) has ``num_computed_tokens == 0``: the KV
  of computed tokens would be in no block;
* counts are ``int`` (not ``bool``, ``float`` or ``str``) and ``>= 0``; ``num_new_tokens``
  may not reach past the request's tokens (``computed + hit + external + new <=
  num_tokens``); lookahead slots past ``max_model_len`` are capped (speculative tokens
  that can never be accepted);
* a prompt longer than ``max_model_len`` is refused at ``new_request``, lookup and
  allocation;
* a hit (:class:`~pagedkv.ComputedBlocks`) is adopted only if this manager issued it for
  this request and its blocks still hold the request's prefix
  (:class:`~pagedkv.errors.InvalidHitError`); O(hit blocks), nothing without a hit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, cast

from pagedkv.core.coordinator import ComputedBlocks, Coordinator
from pagedkv.core.hashing import BlockHasher, HashExtras
from pagedkv.core.pool import BlockPool
from pagedkv.errors import DuplicateRequestError, InvalidArgumentError, InvalidHitError

if TYPE_CHECKING:
    from pagedkv.core.request import RequestLike


class ManagerView(Protocol):
    """What the checks read of the façade (:class:`pagedkv.KVCacheManager`)."""

    @property
    def live_requests(self) -> Mapping[str, RequestLike]: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def hasher(self) -> BlockHasher: ...

    @property
    def issuer_token(self) -> object: ...

    @property
    def pool(self) -> BlockPool: ...

    @property
    def coordinator(self) -> Coordinator: ...

    def require_live(self, request_id: str) -> None: ...


def check_request_retention(request_id: str, retention: object) -> None:
    """A request's ``retention`` is interpreted by the retention component; the core
    checks its shape (an object with ``block_runs``, e.g.
    :class:`pagedkv.retention.RequestRetention`).

    Raises:
        InvalidArgumentError: anything else.
    """
    if not callable(getattr(retention, "block_runs", None)):
        raise InvalidArgumentError(
            f"request {request_id!r}: retention must be a "
            f"pagedkv.retention.RequestRetention, got {type(retention).__name__}"
        )

__all__ = [
    "ManagerView",
    "check_cache_blocks",
    "check_count",
    "check_estimate",
    "check_free",
    "check_hashed",
    "check_hit",
    "check_lookup",
    "check_new_request",
    "check_request_id",
    "request_of",
]


def check_request_id(request_id: object) -> str:
    """``request_id`` if it is a non-empty ``str``.

    Raises:
        InvalidArgumentError: any other value.
    """
    if type(request_id) is not str or not request_id:
        raise InvalidArgumentError(
            f"request ids are non-empty strings, got {request_id!r}; convert the engine's id "
            "with str()"
        )
    return request_id


def check_count(name: str, value: object) -> int:
    """``value`` if it is an ``int >= 0`` (``bool`` is refused).

    Raises:
        InvalidArgumentError: any other value; the message names ``name``.
    """
    if type(value) is not int or value < 0:
        raise InvalidArgumentError(
            f"{name} must be an int >= 0, got {value!r}; pass a whole number of tokens"
        )
    return value


def request_of(obj: object) -> RequestLike:
    if isinstance(obj, (str, bytes, int)) or obj is None or not hasattr(obj, "request_id"):
        raise InvalidArgumentError(
            f"expected a request object (pagedkv.Request or a RequestLike), got {obj!r}; "
            "create one with mgr.new_request(...)"
        )
    return cast("RequestLike", obj)


def check_new_request(
    mgr: ManagerView,
    request_id: object,
    prompt_token_ids: Sequence[int],
    block_hashes: Sequence[bytes] | None,
    hash_extras: HashExtras | None,
) -> None:
    """Checks of :meth:`KVCacheManager.new_request`; the token ids themselves are checked
    by :class:`~pagedkv.Request`.

    Raises:
        InvalidArgumentError: a bad id, an over-long prompt, bad hashes or extras.
        DuplicateRequestError: the id is live.
    """
    rid = check_request_id(request_id)
    if rid in mgr.live_requests:
        raise DuplicateRequestError(
            f"request id {rid!r} belongs to a live request (it holds blocks); free it first "
            "or give the new request another id"
        )
    if not isinstance(prompt_token_ids, Sequence) or isinstance(prompt_token_ids, (str, bytes)):
        raise InvalidArgumentError(
            f"request {rid!r}: prompt_token_ids must be a sequence of ints, got "
            f"{type(prompt_token_ids).__name__}"
        )
    if len(prompt_token_ids) > mgr.max_model_len:
        raise InvalidArgumentError(
            f"request {rid!r}: a {len(prompt_token_ids)}-token prompt is longer than "
            f"max_model_len={mgr.max_model_len}; truncate it or raise max_model_len"
        )
    if hash_extras is not None and not isinstance(hash_extras, HashExtras):
        raise InvalidArgumentError(
            f"request {rid!r}: hash_extras must be a HashExtras, got {hash_extras!r}"
        )
    if block_hashes is not None:
        bs = mgr.hasher.block_size
        if len(block_hashes) > len(prompt_token_ids) // bs:
            raise InvalidArgumentError(
                f"request {rid!r}: {len(block_hashes)} block hashes for "
                f"{len(prompt_token_ids)} tokens, which fill only "
                f"{len(prompt_token_ids) // bs} blocks of {bs}; give one hash per full block"
            )
        for i, h in enumerate(block_hashes):
            if type(h) is not bytes:
                raise InvalidArgumentError(
                    f"request {rid!r}: block hash {i} must be bytes (a digest), got {h!r}"
                )


def check_lookup(mgr: ManagerView, request: object) -> None:
    """Checks of :meth:`KVCacheManager.get_computed_blocks`.

    Raises:
        InvalidArgumentError: not a request, or a prompt longer than ``max_model_len``.
    """
    req = request_of(request)
    if req.num_tokens > mgr.max_model_len:
        raise InvalidArgumentError(
            f"request {req.request_id!r} has {req.num_tokens} tokens, more than "
            f"max_model_len={mgr.max_model_len}; finish it at max_model_len"
        )


def check_estimate(request: object) -> None:
    """Checks of :meth:`KVCacheManager.estimate_cached_tokens`.

    Raises:
        InvalidArgumentError: not a request, or its id is not a str.
    """
    check_request_id(request_of(request).request_id)


def check_free(mgr: ManagerView, request: object) -> str:
    """The id to free: ``request`` itself (a str) or its ``request_id``.

    Raises:
        InvalidArgumentError: neither a str nor a request.
        DuplicateRequestError: a request object whose id a *different* live request holds.
    """
    if type(request) is str:
        return request
    req = request_of(request)
    rid = check_request_id(req.request_id)
    live = mgr.live_requests.get(rid)
    if live is not None and live is not request:
        raise DuplicateRequestError(
            f"request id {rid!r} belongs to another live request object; freeing this one "
            "would free that one's blocks (free by id, mgr.free(request_id), if you mean it)"
        )
    return rid


def check_cache_blocks(mgr: ManagerView, request: object, num_computed_tokens: object) -> None:
    """Checks of :meth:`KVCacheManager.cache_blocks`.

    Raises:
        InvalidArgumentError: a bad count, or tokens beyond the slots the request holds.
        UnknownRequestError: the request holds no blocks.
    """
    req = request_of(request)
    rid = check_request_id(req.request_id)
    n = check_count("num_computed_tokens", num_computed_tokens)
    mgr.require_live(rid)
    if mgr.live_requests[rid] is not request:
        raise DuplicateRequestError(
            f"request id {rid!r} belongs to another live request object"
        )
    slots = mgr.coordinator.num_token_slots(rid)
    if min(n, req.num_tokens) > slots:
        raise InvalidArgumentError(
            f"request {rid!r}: cannot register {n} computed tokens, it holds slots for "
            f"{slots}; allocate_slots first"
        )


def check_hashed(req: RequestLike, rid: str, num_tokens: int) -> None:
    """Refuse a request whose tokens were appended to ``all_token_ids`` behind the
    facade: a pagedkv Request hashes every full block as its tokens are appended."""
    owned = getattr(req, "_owned_tokens", None)
    if owned is not None and owned != num_tokens:
        raise InvalidArgumentError(
            f"request {rid!r} has {num_tokens} tokens but {owned} came through "
            "append_output_tokens: all_token_ids was changed directly, which skips hashing; "
            "add tokens with request.append_output_tokens (nothing was allocated)")


def check_hit(mgr: ManagerView, req: RequestLike, rid: str, hit: ComputedBlocks) -> None:
    """Refuse a hit ``allocate_slots`` may not adopt for ``req``: issued by another
    manager or for another request, a count out of range, a group's own hit longer than
    the adopted one, or blocks that lost their hash since the lookup. No state change."""
    if hit.issuer is not mgr.issuer_token or hit.request_id != rid:
        whose = "another manager" if hit.issuer is not mgr.issuer_token else (
            f"request {hit.request_id!r}")
        raise InvalidHitError(
            f"request {rid!r}: this hit was issued for {whose}; pass the hit that "
            "get_computed_blocks returned for this request on this manager"
        )
    if type(hit.num_computed_tokens) is not int or not (
            0 <= hit.num_computed_tokens < req.num_tokens):
        raise InvalidHitError(
            f"request {rid!r}: a hit of {hit.num_computed_tokens!r} tokens for a "
            f"{req.num_tokens}-token request; look it up again with get_computed_blocks"
        )
    if hit.group_tokens is not None and max(hit.group_tokens) > hit.num_computed_tokens:
        raise InvalidHitError(
            f"request {rid!r}: a group's own hit ({max(hit.group_tokens)} tokens) is "
            f"longer than the {hit.num_computed_tokens} tokens adopted; adopt the hit "
            "every group agrees on (lookup_prefix)")
    if hit.generation == mgr.pool.prefix.index_generation and hit.fingerprint == (
            hit.num_computed_tokens, *map(tuple, hit.block_ids)):
        return  # unchanged since the lookup, and no block lost or changed its hash since
    why = (mgr.coordinator.hit_problem(req.block_hashes, hit.block_ids, hit.num_computed_tokens)
           if hit.group_tokens is None else mgr.coordinator.group_hit_problem(
               req.block_hashes, hit.block_ids, hit.group_tokens))
    if why is not None:
        raise InvalidHitError(
            f"request {rid!r}: the hit cannot be adopted: {why}; look it up again with "
            "get_computed_blocks right before allocate_slots"
        )
