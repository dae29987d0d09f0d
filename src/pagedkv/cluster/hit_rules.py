"""Which prefix of a prompt a replica can reuse, from the index's per-group presence.

The engine's own rule (pagedkv's coordinator, vLLM's) decides a hit from its prefix
index, group by group. The router sees the same blocks through the cluster index, so it
applies the same rules to the mirrored presence:

* **full attention** (MLA and attention sinks included): the longest run of held blocks
  from block 0;
* **sliding window** ``w``, block size ``b``: within the bound, the rightmost run of
  ``ceil((w - 1) / b)`` held blocks decides the hit (the blocks before it are not read);
  without such a run, the held run that starts at block 0;
* several groups (a hybrid model): full-attention groups give a first bound ``C``; every
  other group is asked for its hit within ``C``; a shorter answer lowers ``C`` and the
  pass repeats until nothing changes (a windowed hit of 80 tokens says nothing about 64,
  so it is asked again, not truncated).

Every hit is also capped at ``num_tokens - 1`` tokens (the engine recomputes the last
token for its logits). A sliding-window MLA group with bounded replay holds nothing and
never lowers a hit. All groups must have one block size (the hash block size); other
attention kinds (chunked local, Mamba, cross attention) raise UnsupportedModelError.

Example: full attention + sliding window 8 at block size 4 (runs of 2 blocks), a 21-token
prompt (at most 5 hit blocks) whose full-attention blocks 0..4 are held and whose
window blocks 0, 1, 3 are held: full attention bounds at 5; the window within 5 scans
4 (miss), 3, 2 (miss), 1, 0 -> run of 2 ends at 2 -> C = 2; stable: 2 blocks.

    >>> kw = {"block_size": 4, "num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
    >>> rules = rules_for([FullAttentionSpec(**kw), SlidingWindowSpec(sliding_window=8, **kw)])
    >>> hybrid_hit_blocks(rules, [{0, 1, 2, 3, 4}, {0, 1, 3}], max_blocks=5)
    2
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence, Set

from pagedkv import (
    FullAttentionSpec,
    InvalidArgumentError,
    KVCacheSpec,
    SlidingWindowSpec,
    UnsupportedModelError,
)

__all__ = ["HitRule", "PrefixRule", "ReplayRule", "WindowRule", "hybrid_hit_blocks",
           "rules_for"]


class HitRule(ABC):
    """One group's hit rule over the positions a replica holds."""

    #: Whether any shorter prefix of a hit is a hit too (then a hit is only truncated).
    downward_closed: bool = False

    @abstractmethod
    def hit_blocks(self, held: Set[int], max_blocks: int) -> int:
        """The longest hit, in blocks, that is ``<= max_blocks``."""


class PrefixRule(HitRule):
    """Full attention: the run of held blocks from block 0.

    >>> PrefixRule().hit_blocks({0, 1, 3}, 4)
    2
    """

    downward_closed = True

    def hit_blocks(self, held: Set[int], max_blocks: int) -> int:
        n = 0
        while n < max_blocks and n in held:
            n += 1
        return n


class WindowRule(HitRule):
    """Sliding window: the rightmost run of ``run_blocks`` held blocks within the bound,
    else the held run from block 0.

    >>> WindowRule(run_blocks=2).hit_blocks({0, 2, 3}, 6)
    4
    >>> WindowRule(run_blocks=2).hit_blocks({0, 2}, 6)
    1
    """

    def __init__(self, *, run_blocks: int) -> None:
        self.run_blocks = run_blocks

    def hit_blocks(self, held: Set[int], max_blocks: int) -> int:
        need = self.run_blocks
        if need == 0:
            return max_blocks
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            if i in held:
                run += 1
                if run == need:
                    return i + need
            else:
                run = 0
        return run  # the run that reached block 0 (possibly empty)


class ReplayRule(HitRule):
    """Sliding-window MLA with bounded prefix replay: the group holds no cached block and
    takes no part in a hit (the engine recomputes its window), so it never lowers one.

    >>> ReplayRule().hit_blocks(set(), 6)
    6
    """

    def hit_blocks(self, held: Set[int], max_blocks: int) -> int:
        return max_blocks


def rules_for(specs: Sequence[KVCacheSpec]) -> tuple[HitRule, ...]:
    """The hit rule of each group, in group order.

    Raises:
        InvalidArgumentError: no specs, or groups with different block sizes.
        UnsupportedModelError: an attention kind the router cannot mirror.
    """
    if not specs:
        raise InvalidArgumentError("rules_for needs at least one KV-cache spec")
    sizes = {s.block_size for s in specs}
    if len(sizes) != 1:
        raise InvalidArgumentError(
            f"the cluster router needs one block size across groups, got {sorted(sizes)}; "
            "configure the groups with the hash block size"
        )
    rules: list[HitRule] = []
    replayed = [getattr(s, "prefix_replay_tokens", 0) > 0 for s in specs]
    if all(replayed):
        raise UnsupportedModelError("the cluster router needs a group that caches; every "
                                    "group replays its window (never a hit)")
    for spec, replay in zip(specs, replayed, strict=True):
        if replay:
            rules.append(ReplayRule())
        elif isinstance(spec, SlidingWindowSpec):
            rules.append(WindowRule(run_blocks=-(-(spec.sliding_window - 1) // spec.block_size)))
        elif isinstance(spec, FullAttentionSpec):
            rules.append(PrefixRule())
        else:
            raise UnsupportedModelError(
                f"the cluster router has no hit rule for {type(spec).__name__}; "
                "supported: full attention (MLA, sinks) and sliding window"
            )
    return tuple(rules)


def hybrid_hit_blocks(
    rules: Sequence[HitRule], held: Sequence[Set[int]], *, max_blocks: int
) -> int:
    """The longest hit valid for every group (module docstring); ``held[g]`` is the set of
    positions group ``g`` holds. Cost: one scan per group and pass."""
    if len(rules) != len(held):
        raise InvalidArgumentError(f"{len(rules)} rules but {len(held)} presence sets")
    bound = max(0, max_blocks)
    for rule, positions in zip(rules, held, strict=True):
        if rule.downward_closed:
            bound = min(bound, rule.hit_blocks(positions, bound))
    others = [(r, p) for r, p in zip(rules, held, strict=True) if not r.downward_closed]
    changed = True
    while changed and bound > 0:
        changed = False
        for rule, positions in others:
            hit = rule.hit_blocks(positions, bound)
            if hit < bound:
                bound = hit
                changed = True
    return bound
