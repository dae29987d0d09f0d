"""A KV connector's load of external tokens at admission (``/ext`` layouts only).

vLLM's scheduler, for a new request whose connector finds ``E`` tokens past the local hit,
calls ``allocate_slots(..., num_external_computed_tokens=E)``: a synchronous load with the
new tokens after them, or an asynchronous one with no new token, caching delayed
(``delay_cache_blocks``) and the groups the load writes named in ``skip_zeroing_group_ids``
(their external blocks are not zeroed). The request then counts ``hit + E (+ new)``
computed tokens and runs on.

vLLM's capacity check counts no block for a Mamba group's loaded state (see
``pagedkv/core/external_blocks.py``); where the pool lacks that block vLLM's allocation
raises midway, so the workload asks a load to leave one block per Mamba group
(``reserved_blocks``): pagedkv then takes the same path as vLLM.

Worked case (a 100-token prompt, a 32-token hit, 2 groups): the draw may give ``E = 48``,
synchronous, 20 new tokens (computed 100 after it), or ``E = 67``, asynchronous, skipping
group 0's zeroing (computed 99).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["ExternalLoad", "draw_external"]


@dataclass(frozen=True, slots=True)
class ExternalLoad:
    """One admission's external tokens and how they arrive."""

    num_external: int
    num_new: int
    delay_caching: bool
    skip_zeroing_group_ids: tuple[int, ...]

    def call_args(self) -> tuple[int, tuple[int, ...], bool]:
        """The extra arguments of the sides' ``allocate``."""
        return self.num_external, self.skip_zeroing_group_ids, self.delay_caching


def draw_external(erng: random.Random, remaining: int, num_groups: int,
                  block_tokens: int) -> ExternalLoad | None:
    """Often (60 %) a load for a request with ``remaining`` tokens past its hit (None
    when fewer than 2): ``E`` in ``1 .. remaining - 1`` (half the time a multiple of
    ``block_tokens`` when one fits, as a block-wise connector loads), then either new
    tokens up to the rest (sync) or none (async, a random subset of groups skip
    zeroing)."""
    if remaining < 2 or erng.random() >= 0.6:
        return None
    whole = (remaining - 1) // block_tokens
    if whole and erng.random() < 0.5:
        num_external = erng.randint(1, whole) * block_tokens
    else:
        num_external = erng.randint(1, remaining - 1)
    if erng.random() < 0.3:
        skip = tuple(g for g in range(num_groups) if erng.random() < 0.5)
        return ExternalLoad(num_external, 0, True, skip)
    rest = remaining - num_external
    num_new = rest if erng.random() < 0.6 else erng.randint(1, rest)
    return ExternalLoad(num_external, num_new, False, ())
