"""gpt-oss: sliding-window (window 128) and full attention layers by ``layer_types``."""

from __future__ import annotations

from pagedkv.core.specs import KVCacheSpec
from pagedkv.planner.readers.base import (
    ReaderContext,
    register_reader,
)
from pagedkv.planner.readers.gemma import alternating_layers


@register_reader("gpt_oss")
def _read_gpt_oss(ctx: ReaderContext) -> list[KVCacheSpec | None]:
    """gpt-oss: ``layer_types`` (default: even layers sliding, odd full), window default
    128, head size default 64."""
    return alternating_layers(ctx, head_dim_default=64, window_default=128)
