"""Block tables and slot mappings for one scheduler step, as int tensors.

Token line of request ``r`` in a step (block size 4)::

    | computed (c_r) | new (n_r) |        position p = c_r .. c_r + n_r - 1
    block table row r: the request's block ids per group, padded with 0 (null) to
    ``num_table_blocks`` columns; slot of position p = table[r, p // bs] * bs + p % bs

Worked case (block size 4): a request with blocks ``[7, 3, 9]``, 5 tokens computed and 3
new: positions 5, 6, 7 sit in table column 1 (block 3) at offsets 1, 2, 3, so the slots are
13, 14, 15. A decode step of a request with 8 computed tokens and blocks ``[7, 3, 9]``:
position 8, column 2, slot 36.

Everything is built with tensor operations: Python touches each request once (to read its
table lengths), never each token or block. Tables are built on the CPU and moved to the
target device in one copy per tensor.

:class:`Placement` maps the manager's block ids to physical pages. The identity is what an
engine normally uses; :class:`ShuffledPlacement` permutes pages (block 0 stays 0) so a test
can show that results do not depend on where blocks physically live.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from pagedkv.errors import InvalidArgumentError
from pagedkv.torch._deps import torch

__all__ = ["BatchTables", "Placement", "ShuffledPlacement", "build_batch_tables"]

_INT32 = array("i")
assert _INT32.itemsize == 4, "C int is not 32 bits on this platform"


class Placement:
    """Manager block id -> physical page index: the identity. Subclasses permute."""

    def physical(self, block_ids: torch.Tensor) -> torch.Tensor:
        """Physical pages of ``block_ids`` (any shape, same shape out). Pure."""
        return block_ids


class ShuffledPlacement(Placement):
    """A seeded random permutation of ``1 .. num_blocks - 1``; the null block stays 0.

    >>> p = ShuffledPlacement(num_blocks=6, seed=0)
    >>> sorted(p.physical(torch.arange(6)).tolist()), int(p.physical(torch.tensor(0)))
    ([0, 1, 2, 3, 4, 5], 0)
    """

    def __init__(self, *, num_blocks: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(num_blocks - 1, generator=gen) + 1
        self.table = torch.cat([torch.zeros(1, dtype=torch.long), perm])

    def physical(self, block_ids: torch.Tensor) -> torch.Tensor:
        table = self.table.to(block_ids.device)
        return table[block_ids.long()].to(block_ids.dtype)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class BatchTables:
    """Per-step tensors for a batch of ``B`` requests holding ``T`` new tokens in total.

    ``block_tables[g]``: ``[B, num_table_blocks[g]]`` int32 physical ids of group ``g``
    (padded with 0). ``slot_mappings[g]``: ``[T]`` int64 slots of the new tokens in group
    ``g`` (``None`` for state groups, which have no token slots). ``positions``: ``[T]``
    int64; ``token_to_request``: ``[T]`` int64 row of each token; ``query_start_loc``:
    ``[B + 1]`` int32 prefix sums of the new-token counts; ``seq_lens``: ``[B]`` int32
    tokens after the step; ``num_computed_tokens`` / ``num_new_tokens``: ``[B]`` int64.
    """

    block_tables: tuple[torch.Tensor, ...]
    slot_mappings: tuple[torch.Tensor | None, ...]
    positions: torch.Tensor
    token_to_request: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    num_computed_tokens: torch.Tensor
    num_new_tokens: torch.Tensor
    block_sizes: tuple[int, ...]

    @property
    def num_requests(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])


def _padded_table(tables: Sequence[Sequence[int]], num_columns: int) -> torch.Tensor:
    """``[B, num_columns]`` int32 from ragged rows, 0-padded: each row is copied once, as a
    C array, into a zeroed buffer (no per-block Python work)."""
    longest = max(map(len, tables), default=0)
    if longest > num_columns:
        raise InvalidArgumentError(
            f"a block table has {longest} blocks but only {num_columns} columns were asked "
            "for; raise num_table_blocks (max_model_len / block_size)"
        )
    buf = array("i", bytes(_INT32.itemsize * num_columns * len(tables)))
    for r, row in enumerate(tables):
        start = r * num_columns
        buf[start:start + len(row)] = array("i", row)
    if not tables:
        return torch.zeros(0, num_columns, dtype=torch.int32)
    return torch.frombuffer(buf, dtype=torch.int32).view(len(tables), num_columns).clone()


def build_batch_tables(
    block_ids: Sequence[Sequence[Sequence[int]]],
    num_computed_tokens: Sequence[int],
    num_new_tokens: Sequence[int],
    *,
    block_sizes: Sequence[int],
    num_table_blocks: Sequence[int],
    token_slot_groups: Sequence[bool] | None = None,
    placement: Placement | None = None,
    device: torch.device | str = "cpu",
) -> BatchTables:
    """Tensors for one step from the manager's block ids.

    ``block_ids[r][g]`` is request ``r``'s table in group ``g`` (``get_block_ids``);
    ``num_computed_tokens[r]`` tokens are already in the cache and ``num_new_tokens[r]``
    are computed in this step. ``num_table_blocks[g]`` fixes the padded width (use
    ``ceil(max_model_len / block_size)`` so every step has the same width).
    ``token_slot_groups[g]`` is False for state groups (no slot mapping). Pure; O(tokens +
    blocks) tensor work and O(requests x groups) Python.

    Raises:
        InvalidArgumentError: mismatched lengths, ``num_new_tokens`` < 1, a table wider
            than ``num_table_blocks``, or a new token without a block in its table.
    """
    num_requests = len(block_ids)
    num_groups = len(block_sizes)
    if len(num_computed_tokens) != num_requests or len(num_new_tokens) != num_requests:
        raise InvalidArgumentError(
            f"{num_requests} block tables but {len(num_computed_tokens)} computed counts and "
            f"{len(num_new_tokens)} new-token counts; give one of each per request"
        )
    if len(num_table_blocks) != num_groups:
        raise InvalidArgumentError("num_table_blocks needs one width per group")
    if any(n < 1 for n in num_new_tokens):
        raise InvalidArgumentError("every request in a step needs num_new_tokens >= 1")
    placement = placement or Placement()
    slot_groups = token_slot_groups or [True] * num_groups
    computed = torch.tensor(num_computed_tokens, dtype=torch.long)
    new = torch.tensor(num_new_tokens, dtype=torch.long)
    token_to_request = torch.repeat_interleave(torch.arange(num_requests), new)
    ends = torch.cumsum(new, 0)
    offsets = torch.arange(int(ends[-1]) if num_requests else 0) - torch.repeat_interleave(
        ends - new, new
    )
    positions = computed[token_to_request] + offsets
    tables = []
    slots: list[torch.Tensor | None] = []
    for g in range(num_groups):
        table = _padded_table([ids[g] for ids in block_ids], num_table_blocks[g])
        table = placement.physical(table)
        tables.append(table.to(device))
        if not slot_groups[g]:
            slots.append(None)
            continue
        bs = block_sizes[g]
        blocks = table[token_to_request, positions // bs].long()
        if positions.numel() and int(blocks.min()) == 0:
            raise InvalidArgumentError(
                f"group {g}: a new token has no block in its table (null block); allocate "
                "slots for every new token before building the step's tables"
            )
        slots.append((blocks * bs + positions % bs).to(device))
    return BatchTables(
        block_tables=tuple(tables),
        slot_mappings=tuple(slots),
        positions=positions.to(device),
        token_to_request=token_to_request.to(device),
        query_start_loc=torch.cat([torch.zeros(1, dtype=torch.long), ends]).int().to(device),
        seq_lens=(computed + new).int().to(device),
        num_computed_tokens=computed.to(device),
        num_new_tokens=new.to(device),
        block_sizes=tuple(block_sizes),
    )
