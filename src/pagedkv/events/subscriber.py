"""Subscribe to KV-cache event streams and mirror each publisher's prefix index.

Kept for existing imports: the mirror state lives in :mod:`pagedkv.events.mirror`
(:class:`MirrorIndex`, :func:`index_counts`) and the ZeroMQ subscriber in
:mod:`pagedkv.events.transport` (:class:`Subscriber`, :class:`SourceStatus`).
"""

from pagedkv.events.mirror import BlockKey, MirrorIndex, MirrorSink, index_counts
from pagedkv.events.transport import SourceStatus, Subscriber

__all__ = ["BlockKey", "MirrorIndex", "MirrorSink", "SourceStatus", "Subscriber", "index_counts"]
