"""Per-attention-type managers: one per KV-cache group, all sharing one block pool.

Each manager class declares the spec classes it serves; :func:`manager_class_for` picks the
class for a spec (the most specific registered base wins), so adding an attention kind means
adding one class with ``@register_manager`` and nothing else.
"""

from pagedkv.managers.base import SingleTypeManager, manager_class_for, register_manager
from pagedkv.managers.full import FullAttentionManager

__all__ = [
    "FullAttentionManager",
    "SingleTypeManager",
    "manager_class_for",
    "register_manager",
]
