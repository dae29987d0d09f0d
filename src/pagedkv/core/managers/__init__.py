"""Per-attention-type managers: one per KV-cache group, all sharing one block pool.

Each manager class declares the spec classes it serves; :func:`manager_class_for` picks the
class for a spec (the most specific registered base wins), so adding an attention kind means
adding one class with ``@register_manager`` and importing its module here.

=====================  ==========================  ==========================================
spec                   manager                     lookup / skipped blocks
=====================  ==========================  ==========================================
full, MLA              FullAttentionManager        left-to-right prefix / none
full with sinks        SinkFullAttentionManager    as full; plus per-request sink blocks
sliding window         SlidingWindowManager        right-to-left window run / before window
chunked local          ChunkedLocalManager         nulls + current chunk / earlier chunks
Mamba, caching on      MambaAlignManager           deepest state (vLLM align) / passed states
Mamba, caching off     MambaManager                never hits / one state block
Mamba + checkpoints    MambaCheckpointManager      deepest checkpoint / finished checkpoints
cross attention        CrossAttentionManager       never hits / encoder blocks held once
=====================  ==========================  ==========================================
"""

from pagedkv.core.managers.base import (
    SingleTypeManager,
    SkippingManager,
    manager_class_for,
    register_manager,
)
from pagedkv.core.managers.chunked_local import ChunkedLocalManager
from pagedkv.core.managers.cross_attention import CrossAttentionManager
from pagedkv.core.managers.full import FullAttentionManager
from pagedkv.core.managers.mamba import MambaAlignManager, MambaCheckpointManager, MambaManager
from pagedkv.core.managers.sinks import SinkFullAttentionManager
from pagedkv.core.managers.sliding_window import SlidingWindowManager

__all__ = [
    "ChunkedLocalManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaAlignManager",
    "MambaCheckpointManager",
    "MambaManager",
    "SingleTypeManager",
    "SinkFullAttentionManager",
    "SkippingManager",
    "SlidingWindowManager",
    "manager_class_for",
    "register_manager",
]
