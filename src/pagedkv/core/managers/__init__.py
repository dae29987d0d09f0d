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
SWA-MLA                WindowMLAManager            as sliding window
SWA-MLA, replayed      ReplayedWindowManager       never joins lookups / before window
=====================  ==========================  ==========================================

Nothing outside this package names a manager class or asks a spec's type: the
coordinators, the factory and the queries read the capabilities each class declares
(class attributes of :class:`~pagedkv.core.managers.base.SingleTypeManager`, documented
there: ``cacheable``, ``joins_lookup``, ``positional``, ``grows_plainly``, ``drops_blocks``,
``may_hold_null_blocks``, ``ignores_lookahead``, ``caps_registration_itself``,
``prefix_closed_hits``, ``drives_partial_hits``, ``partial_hit_class``, ``hit_shape``,
and the method ``admission_cap_blocks``) and those of its spec (``event_kind``,
``event_sliding_window``, ``zeroes_kv_by_default``, ``zeroable``, ``max_admission_blocks``).

How to add a kind:

1. Its spec in :mod:`pagedkv.core.specs`: a frozen dataclass deriving from
   ``AttentionSpec`` (KV per token) or ``KVCacheSpec``, with ``kind``, ``event_kind``,
   ``page_size_bytes`` and ``max_admission_blocks`` (the planner and admission read it);
   override ``event_sliding_window`` / ``zeroes_kv_by_default`` if they differ.
2. Its manager, one module here: a class deriving from ``SingleTypeManager`` (or
   ``SkippingManager`` when requests stop needing their oldest blocks: then implement
   ``num_skipped_tokens``), decorated ``@register_manager(TheSpec)``, implementing
   ``find_longest_cache_hit`` and any allocation rule that differs; set every capability
   whose default does not hold (a kind that changes how a table grows sets
   ``grows_plainly = False``, one that never caches ``cacheable = False``...). Sub-block
   hits: derive a class from :class:`~pagedkv.core.managers.partial.PartialHitManager`
   too and name it in ``partial_hit_class``. ``variant_for`` hands a spec option or the
   caching mode to another class.
3. Registration: import the module below (the decorator runs on import) and add the class
   to ``__all__`` and the table above.
4. Tests: the kind's lookup and skipping rules in ``tests/hybrid``, and its layout in the
   combination matrix (``tests/architecture/test_component_matrix.py``).
"""

from pagedkv.core.managers.base import (
    SingleTypeManager,
    manager_class_for,
    register_manager,
)
from pagedkv.core.managers.chunked_local import ChunkedLocalManager
from pagedkv.core.managers.cross_attention import CrossAttentionManager
from pagedkv.core.managers.full import FullAttentionManager
from pagedkv.core.managers.mamba import MambaAlignManager, MambaCheckpointManager, MambaManager
from pagedkv.core.managers.partial import PartialHitManager
from pagedkv.core.managers.sinks import SinkFullAttentionManager
from pagedkv.core.managers.skipping import SkippingManager
from pagedkv.core.managers.sliding_window import SlidingWindowManager
from pagedkv.core.managers.window_mla import ReplayedWindowManager, WindowMLAManager

__all__ = [
    "ChunkedLocalManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaAlignManager",
    "MambaCheckpointManager",
    "MambaManager",
    "PartialHitManager",
    "ReplayedWindowManager",
    "SingleTypeManager",
    "SinkFullAttentionManager",
    "SkippingManager",
    "SlidingWindowManager",
    "WindowMLAManager",
    "manager_class_for",
    "register_manager",
]
