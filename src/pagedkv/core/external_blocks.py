"""A new request's external tokens (a KV connector's load), allocated as vLLM does.

vLLM 0.33 and 0.32 (``KVCacheCoordinator.allocate_new_computed_blocks``) give a new
request its blocks in three phases over all groups: every group adopts its hit, then every
group takes the blocks for the *external* tokens (``allocate_external_computed_blocks``),
then every group takes the blocks for the new tokens. Only the last phase's blocks are
what ``allocate_slots`` returns; the external ones join the tables, and are recorded for
zeroing except in the groups an async load writes (``skip_zeroing_group_ids``).

The phase order decides block ids on a layout of several groups (the free queue hands out
blocks in order): group 1's external blocks come before group 0's new ones. A Mamba group
keeps only the last external token's state, so it gets one block for the loaded state, at
position ``ceil(total / block_size) - 1``, and its live block for new tokens after it.

vLLM's capacity check counts at most one new block for an align-mode Mamba group, so a
load whose new tokens cross into another block takes one block more than it counted (the
loaded state's and the live one). Where the pool has that block (the headroom, or a free
block beyond the count) vLLM goes on, and so does pagedkv; where it has not, vLLM's
``get_new_blocks`` raises ``ValueError`` midway, and pagedkv refuses the allocation
instead (``None``, nothing changed): :func:`uncounted_blocks`.

Worked case (full attention 16 + Mamba 16, no hit, 40 external tokens, 8 new, free queue
``1, 2, ...``): full attention gets ``[1, 2, 3]`` and Mamba ``[0, 0, 4]`` here; 48 tokens
still end in block 2, so neither group takes a new block and ``allocate_slots`` returns
``([], [])``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.core.managers.base import SingleTypeManager

__all__ = ["allocate_external", "uncounted_blocks"]


def allocate_external(
    managers: Sequence[SingleTypeManager],
    request_id: str,
    num_local_computed_tokens: int,
    total_computed_tokens: int,
    zeroing: Sequence[bool],
    new_block_ids: Sequence[list[int]],
    skip_zeroing_group_ids: tuple[int, ...] = (),
) -> None:
    """Every group's blocks for the request's external tokens (``num_local_computed_tokens
    .. total_computed_tokens``), in group order (see
    :meth:`SingleTypeManager.allocate_external_blocks`); a group with ``zeroing[g]``
    records its new ones in ``new_block_ids[g]`` unless ``g`` is in
    ``skip_zeroing_group_ids``. Preconditions: every table was started with its hit, and
    capacity was checked. O(blocks allocated)."""
    for g, m in enumerate(managers):
        new = m.allocate_external_blocks(request_id, num_local_computed_tokens,
                                         total_computed_tokens)
        if new and zeroing[g] and g not in skip_zeroing_group_ids:
            new_block_ids[g].extend(new)


def uncounted_blocks(managers: Sequence[SingleTypeManager], slots: Sequence[int],
                     total_computed_tokens: int) -> int:
    """Blocks a new request's load takes beyond what vLLM's capacity check counted: one
    per align-mode Mamba group (:attr:`SingleTypeManager.ignores_lookahead`) whose
    ``slots[g]`` tokens end in a later block than the loaded state's. No state change."""
    n = 0
    for m, num_tokens in zip(managers, slots, strict=True):
        bs = m.block_size
        if m.ignores_lookahead and -(-num_tokens // bs) > -(-total_computed_tokens // bs):
            n += 1
    return n
