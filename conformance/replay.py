"""The scheduler's bounded prefix replay (DeepSeek-V4's SWA-MLA), as the workload applies
it to an admission on a layout with a ``swamla`` group (``Layout.replay_tokens`` = W > 0).

vLLM 0.33's scheduler, for a fresh admission whose lookup hit ``H`` tokens:

* ``0 < H <= W``: the hit is dropped (it would be recomputed whole): the request is
  allocated from token 0 without hit blocks;
* ``H > W``: the hit is adopted, the request's computed count is rewound to
  ``replay_start = H - W`` and the chunk scheduled from there re-computes the hit's last
  ``W`` tokens first; ``allocate_slots`` is asked for the tokens *past the hit* only
  (``max(scheduled - W, 0)``: a chunk ending inside the replayed range needs none).

:func:`plan_admission` turns the workload's draw (``num_new`` tokens past the hit) into
the manager call and the request's computed count afterwards; ``replay_only`` asks for a
chunk of ``replay_only`` tokens ending inside the replayed range instead.

Worked cases (W = 32): hit 96, 4 new -> adopt, allocate 4, computed 100 (scheduled 36
from 64); hit 96, replay-only chunk 16 -> adopt, allocate 0, computed 80; hit 32, 10 new
-> drop the hit, allocate 42, computed 42.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Admission", "plan_admission"]


class Admission(NamedTuple):
    """How an admission calls the manager: ``use_hit`` (adopt the looked-up hit),
    ``num_new`` (``allocate_slots``'s new tokens) and the computed count once the
    scheduled chunk has run."""

    use_hit: bool
    num_new: int
    computed: int


def plan_admission(replay_tokens: int, num_hit: int, num_new: int,
                   replay_only: int = 0) -> Admission:
    """The admission of a request with a ``num_hit``-token hit and ``num_new`` tokens
    drawn past it (module docstring); ``replay_only`` (1 .. ``replay_tokens``), when
    given and the hit is replayed, schedules that many tokens from the replay start."""
    if not replay_tokens or not num_hit:
        return Admission(True, num_new, num_hit + num_new)
    if num_hit <= replay_tokens:
        return Admission(False, num_hit + num_new, num_hit + num_new)
    start = num_hit - replay_tokens
    if replay_only:
        return Admission(True, 0, start + min(replay_only, replay_tokens))
    return Admission(True, num_new, num_hit + num_new)
