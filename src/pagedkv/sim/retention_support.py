"""``pagedkv simulate --retention POLICY``: a retention policy beside LRU and Belady.

The simulator's own run stays vLLM's LRU. With ``--retention`` (``SimConfig.retention``)
the workload is also replayed in pure-cache mode (lookup, compute the whole prompt, free;
:func:`~pagedkv.sim.retention_replay.replay_pure_cache`) at the run's capacity twice: under
``LRU()`` and under the policy, on the policy's simulated clock. The report gets one
section (:func:`compare_retention` -> :class:`RetentionComparison`): both hit rates, the
difference in points, and the Belady optimum at the same capacity (None with
``--no-bounds``).

Policies (:data:`POLICIES`; none looks ahead):

* ``lru`` — no retention (the comparison's baseline against itself: difference 0).
* ``pin-popular`` — pin a request's leading blocks that an earlier request also carried
  (a shared system prompt), renewed by hits, within half the pool.
* ``popularity-priority`` — blocks carried by several requests are freed at a higher
  priority (35 + 15 per extra request).
* ``tenant-quota`` — the tenant ``batch`` (request ids ``batch/...``) keeps at most 10 %
  of the pool in free cached blocks; a workload without tenant prefixes in its request
  ids is unaffected.

>>> from pagedkv.sim import system_prompts
>>> wl = system_prompts(num_groups=4, questions_per_group=10)
>>> cmp = compare_retention(wl, policy="pin-popular", block_size=16, num_blocks=200,
...                         with_belady=True)
>>> cmp.policy, cmp.num_blocks, cmp.policy_hit_rate >= cmp.lru_hit_rate
('pin-popular', 200, True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pagedkv.errors import InvalidArgumentError
from pagedkv.sim.bounds import access_sequence, belady_hits
from pagedkv.sim.retention_replay import (
    LRU,
    PinPopularPrefixes,
    PopularityPriority,
    SimRetentionPolicy,
    TenantQuota,
    replay_pure_cache,
)
from pagedkv.sim.workloads import Workload

__all__ = ["POLICIES", "RetentionComparison", "check_policy",
           "compare_retention", "render_rows"]

#: ``--retention`` names and the policies they build (fresh state per replay).
POLICIES: dict[str, Callable[[], SimRetentionPolicy]] = {
    "lru": LRU,
    "pin-popular": PinPopularPrefixes,
    "popularity-priority": PopularityPriority,
    "tenant-quota": TenantQuota,
}


def check_policy(name: str | None) -> None:
    """Raise :class:`InvalidArgumentError` unless ``name`` is None or a policy name."""
    if name is not None and name not in POLICIES:
        raise InvalidArgumentError(
            f"--retention: unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionComparison:
    """Pure-cache hit rates (fractions of prompt tokens) of ``policy`` and of LRU at
    ``num_blocks`` blocks of ``block_size`` tokens, all requests and from request
    ``warmup_requests`` on; ``belady_hit_rate`` None when bounds were skipped.
    ``gain_points``: (policy - LRU) in percentage points."""

    policy: str
    block_size: int
    num_blocks: int
    warmup_requests: int
    lru_hit_rate: float
    policy_hit_rate: float
    lru_hit_rate_after_warmup: float
    policy_hit_rate_after_warmup: float
    belady_hit_rate: float | None
    gain_points: float
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (every field)."""
        return asdict(self)


def compare_retention(
    workload: Workload,
    *,
    policy: str,
    block_size: int,
    num_blocks: int,
    warmup_fraction: float = 0.5,
    with_belady: bool = True,
    note: str | None = None,
) -> RetentionComparison:
    """Replay ``workload`` in pure-cache mode under LRU and under ``policy`` at
    ``num_blocks`` blocks (module docstring). O(requests x blocks per request) per replay,
    plus Belady's O(accesses x log capacity) when ``with_belady``.

    Raises:
        InvalidArgumentError: an unknown policy, or a capacity/block size the workload
            cannot be replayed at.
    """
    check_policy(policy)
    start = int(len(workload.requests) * warmup_fraction)
    lru = replay_pure_cache(workload, block_size=block_size, num_blocks=num_blocks,
                            policy=LRU())
    mine = lru if policy == "lru" else replay_pure_cache(
        workload, block_size=block_size, num_blocks=num_blocks, policy=POLICIES[policy]())
    belady = None
    if with_belady:
        seq = access_sequence(workload, block_size)
        belady = belady_hits(seq, num_blocks - 1).hit_rate()
    return RetentionComparison(
        policy=policy, block_size=block_size, num_blocks=num_blocks, warmup_requests=start,
        lru_hit_rate=lru.hit_rate(), policy_hit_rate=mine.hit_rate(),
        lru_hit_rate_after_warmup=lru.hit_rate(start),
        policy_hit_rate_after_warmup=mine.hit_rate(start), belady_hit_rate=belady,
        gain_points=100 * (mine.hit_rate() - lru.hit_rate()), note=note,
    )


def render_rows(c: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """The report section (title, rows) for a :meth:`RetentionComparison.to_dict`."""
    def pct(x: float | None) -> str:
        return "—" if x is None else f"{100 * x:.1f} %"

    after = c["policy_hit_rate_after_warmup"] - c["lru_hit_rate_after_warmup"]
    rows = [
        ("LRU (vLLM)", f"{pct(c['lru_hit_rate'])}  (after warm-up "
                       f"{pct(c['lru_hit_rate_after_warmup'])})"),
        (f"{c['policy']}", f"{pct(c['policy_hit_rate'])}  (after warm-up "
                           f"{pct(c['policy_hit_rate_after_warmup'])})"),
        (f"{c['policy']} vs LRU", f"{c['gain_points']:+.1f} points  (after warm-up "
                                  f"{100 * after:+.1f})"),
        ("Belady optimum", pct(c["belady_hit_rate"])),
    ]
    if c.get("note"):
        rows.append(("note", c["note"]))
    title = f"Retention vs LRU (pure-cache, {c['num_blocks'] - 1:,} blocks)"
    return title, rows
