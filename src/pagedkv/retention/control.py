"""What an engine calls to steer retention: pins with leases, and the per-request
retention applied when a request releases its blocks.

A manager built with ``CacheConfig(retention=RetentionConfig(...))`` exposes one
:class:`RetentionControl` as ``mgr.retention`` (``None`` without retention)::

    lease = mgr.retention.pin_prefix(req, ttl_s=600, refresh_on_hit=True)
    ...
    mgr.retention.unpin(lease)

A request's own retention (:class:`~pagedkv.retention.policy.RequestRetention`) is given
at creation (``mgr.new_request(..., retention=...)``, or a ``retention`` attribute on an
engine's own request type) and applied to every block it holds when it is freed: the
priority and duration of each block become the request's (TensorRT-LLM: "new priority
values always override the previous value"). A request without retention leaves its
blocks' retention as it was (a fresh block has the default priority), so a hot system
prompt keeps its priority when plain requests share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pagedkv.checks import check_flag
from pagedkv.core.components import ManagerComponent
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.request import RequestLike
from pagedkv.errors import InvalidArgumentError
from pagedkv.retention.eviction import RetentionPolicy
from pagedkv.retention.pins import PinKey, PinLease
from pagedkv.retention.policy import RequestRetention

if TYPE_CHECKING:
    from pagedkv.core.manager import KVCacheManager

__all__ = ["RetentionControl"]



def _lease(lease: object) -> PinLease:
    if not isinstance(lease, PinLease):
        raise InvalidArgumentError(
            f"expected a PinLease (what pin() or pin_prefix() returned), got {lease!r:.60}")
    return lease


class RetentionControl(ManagerComponent):
    """Pins and per-request retention for one manager (module docstring); the façade's
    ``retention`` component.

    >>> from pagedkv import CacheConfig, FullAttentionSpec, KVCacheManager
    >>> from pagedkv.retention import RetentionConfig
    >>> spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    >>> now = [0.0]
    >>> mgr = KVCacheManager(CacheConfig(groups=(spec,), num_blocks=9, max_model_len=64,
    ...                      retention=RetentionConfig(clock=lambda: now[0])))
    >>> req = mgr.new_request("sys", list(range(9)))
    >>> _ = mgr.allocate_slots(req, 9); mgr.free(req)
    >>> lease = mgr.retention.pin_prefix(req, ttl_s=60)
    >>> mgr.num_free_blocks       # the two pinned prefix blocks are held out
    6
    >>> now[0] = 61.0             # the lease ends
    >>> mgr.num_free_blocks
    8
    """

    def __init__(self, policy: RetentionPolicy) -> None:
        super().__init__("retention")
        self.policy = policy
        self.managers: list[SingleTypeManager] = []
        self._nulls: list[bool] = []
        self._strides: list[tuple[int, int]] = []

    def bind(self, manager: KVCacheManager) -> None:
        self.managers = list(manager.managers)
        #: Per manager: whether its tables may hold the null block (full attention
        #: tables never do, which spares a scan of every freed table).
        self._nulls = [m.may_hold_null_blocks for m in self.managers]
        self._strides = [(m.group, m.hash_stride) for m in self.managers if m.cacheable]

    # ------------------------------------------------------------------ pins

    def pin(
        self, block_hashes: Sequence[bytes], *, ttl_s: float, refresh_on_hit: bool = False
    ) -> PinLease:
        """Pin the prefix whose chained block hashes (at the hash block size, as in
        ``Request.block_hashes``) are ``block_hashes``, in every caching group, for
        ``ttl_s`` seconds. Cached blocks are held at once; blocks registered later under
        these hashes are held when they are. ``refresh_on_hit``: every hit on a pinned
        block restarts the lease's ``ttl_s``.

        Budget: the distinct pinned keys (one per group and block) may not pass
        ``pin_budget_fraction`` of the pool.

        Raises:
            PinBudgetError: the pin would pass the budget; nothing was pinned.
            InvalidArgumentError: ``ttl_s`` is not positive and finite, or no hashes.
        """
        if isinstance(block_hashes, (str, bytes)) or not isinstance(block_hashes, Sequence) \
                or not all(type(h) is bytes for h in block_hashes):
            raise InvalidArgumentError(
                f"block_hashes must be a sequence of bytes (Request.block_hashes), got "
                f"{block_hashes!r:.60}")
        check_flag("refresh_on_hit", refresh_on_hit)
        keys: list[PinKey] = []
        for g, k in self._strides:
            hashes = block_hashes if k == 1 else block_hashes[k - 1 :: k]
            keys.extend((g, h) for h in hashes)
        return self.policy.pin(keys, ttl_s=ttl_s, refresh_on_hit=refresh_on_hit)

    def pin_prefix(
        self,
        request: RequestLike,
        *,
        ttl_s: float,
        num_tokens: int | None = None,
        refresh_on_hit: bool = False,
    ) -> PinLease:
        """Pin the first ``num_tokens`` tokens of ``request`` (default: all its full
        blocks), rounded down to whole hash blocks. See :meth:`pin`.

        Raises:
            InvalidArgumentError: a negative ``num_tokens``, or a prefix shorter than one
                block; also as :meth:`pin`.
            PinBudgetError: as :meth:`pin`.
        """
        hashes = getattr(request, "block_hashes", None)
        if hashes is None or isinstance(request, (str, bytes, list, tuple)):
            raise InvalidArgumentError(
                f"expected a request (pagedkv.Request or a RequestLike), got "
                f"{request!r:.60}; pin a prefix of hashes with pin()")
        if num_tokens is not None:
            if type(num_tokens) is not int or num_tokens < 0:
                raise InvalidArgumentError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
            hashes = hashes[: num_tokens // self.policy.pool.hash_block_size]
        return self.pin(hashes, ttl_s=ttl_s, refresh_on_hit=refresh_on_hit)

    def unpin(self, lease: PinLease) -> None:
        """End ``lease`` now; keys no other lease holds become evictable (their free
        blocks join their priority level as if freed now). Ending an ended lease does
        nothing.

        Raises:
            InvalidArgumentError: ``lease`` is not a :class:`PinLease` (from :meth:`pin`).
        """
        self.policy.unpin(_lease(lease))

    def renew(self, lease: PinLease, *, ttl_s: float) -> None:
        """Make ``lease`` end ``ttl_s`` seconds from now.

        Raises:
            InvalidArgumentError: the lease has ended, or a bad ``ttl_s``.
        """
        self.policy.renew(_lease(lease), ttl_s=ttl_s)

    @property
    def num_pinned_blocks(self) -> int:
        """Distinct pinned keys (counted against the budget)."""
        return len(self.policy.pins.keys)

    @property
    def pin_budget_blocks(self) -> int:
        """The most keys that may be pinned at once."""
        return self.policy.pins.budget_keys

    @property
    def num_parked_blocks(self) -> int:
        """Free blocks held out of eviction by pins (not counted as free)."""
        return self.policy.num_parked

    # ------------------------------------------------------------------ requests

    @staticmethod
    def check_retention(request_id: str, retention: object) -> None:
        """Raise :class:`InvalidArgumentError` unless ``retention`` is a RequestRetention."""
        if not isinstance(retention, RequestRetention):
            raise InvalidArgumentError(
                f"request {request_id!r}: retention must be a "
                f"pagedkv.retention.RequestRetention, got {type(retention).__name__}"
            )

    def before_free(self, request: RequestLike | str, live: RequestLike | None) -> None:
        """The façade's hook: :meth:`apply_retention` to the tracked request."""
        self.apply_retention(live)

    def apply_retention(self, request: RequestLike | None) -> None:
        """Give every block ``request`` holds the retention the request asks for (its
        ``retention`` attribute; none, or no request: nothing changes). Called by the
        manager's ``free`` before the blocks are released. O(blocks held + ranges^2),
        applied run by run (:meth:`RequestRetention.block_runs`).

        Raises:
            InvalidArgumentError: ``retention`` is not a RequestRetention; nothing changed.
        """
        retention = getattr(request, "retention", None)
        if retention is None or request is None:
            return
        if not isinstance(retention, RequestRetention):
            self.check_retention(request.request_id, retention)
        assert isinstance(retention, RequestRetention)
        rid = request.request_id
        num_prompt = getattr(request, "num_prompt_tokens", None)
        if num_prompt is None:
            num_prompt = request.num_tokens
        queue = self.policy.specialise()  # the first request with retention ends uniform mode
        if retention.has_durations:
            queue.plain = False
        prio, dur = queue.priority, queue.duration_s
        for m, nulls in zip(self.managers, self._nulls, strict=True):
            blocks = m.req_to_blocks.get(rid)
            if not blocks:
                continue
            # Run by run (equal retention), not block by block: no per-block lists.
            runs = retention.block_runs(len(blocks), m.block_size,
                                        num_prompt_tokens=num_prompt)
            if nulls and not all(blocks):  # null blocks (windowed kinds): no retention
                for first, stop, p, d in runs:
                    for b in blocks[first:stop]:
                        if b:
                            prio[b] = p
                            dur[b] = d
                continue
            for first, stop, p, d in runs:
                for b in blocks[first:stop]:
                    prio[b] = p
                    dur[b] = d
