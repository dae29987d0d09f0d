"""Sliding-window MLA (DeepSeek-V4's SWA layers): a sliding window over MLA latents, and
its bounded-replay form.

A ``SlidingWindowMLASpec`` stores one latent vector per token (no separate K and V, as
:class:`~pagedkv.core.specs.MLAAttentionSpec`) and reads a window of ``sliding_window``
tokens, as :class:`~pagedkv.core.specs.SlidingWindowSpec`.

``bounded_replay=True`` (vLLM 0.32/0.33's ``SlidingWindowMLASpec.bounded_replay``) turns
the group into per-request scratch: its blocks are never registered in the prefix index
and it takes no part in lookups, so a hit is decided by the other groups alone and this
group's part of it is empty. The caller recomputes (*replays*) the hit's last
``prefix_replay_tokens`` tokens to rebuild this group's window; see
:class:`~pagedkv.core.managers.window_mla.ReplayedWindowManager`.

Worked case (bf16, one latent head of 576, block 64): page = 64 x 576 x 2 = 73,728 bytes
(half a plain sliding-window page of the same shape).

>>> spec = SlidingWindowMLASpec(block_size=64, num_kv_heads=1, head_size=576, dtype_bytes=2,
...                             sliding_window=128, bounded_replay=True)
>>> spec.page_size_bytes, spec.prefix_replay_tokens
(73728, 128)
>>> SlidingWindowMLASpec(block_size=64, num_kv_heads=1, head_size=576, dtype_bytes=2,
...                      sliding_window=128).prefix_replay_tokens
0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pagedkv.core.specs import SlidingWindowSpec

__all__ = ["SlidingWindowMLASpec"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """A sliding window over MLA latents; ``bounded_replay``: never prefix-cached, the
    hit's last window is recomputed instead (module docstring)."""

    kind: ClassVar[str] = "sliding_window_mla"
    event_kind: ClassVar[str] = "sliding_window_mla"  # vLLM's KVCacheSpecKind value
    bounded_replay: bool = False

    @property
    def page_size_bytes(self) -> int:
        """One latent per token and head: no factor 2 for K and V."""
        return self.block_size * self.num_kv_heads * self.head_size * self.dtype_bytes

    @property
    def prefix_replay_tokens(self) -> int:
        """Tokens of a hit the caller recomputes: the window with bounded replay, else 0."""
        return self.sliding_window if self.bounded_replay else 0
