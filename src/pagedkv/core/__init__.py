"""The exact engine: vLLM 0.33's v1 KV-cache manager, block for block.

Everything an engine needs per scheduler step and nothing else: layer specs
(:mod:`~pagedkv.core.specs`), block hashing (:mod:`~pagedkv.core.hashing`), requests,
the event recorder, the block pool and its free queue, one manager per attention kind
(:mod:`~pagedkv.core.managers`), the coordinators and the façade
(:class:`~pagedkv.core.manager.KVCacheManager`). Features (events transport, planner,
retention, host tier, observability) live above this package and attach as components;
nothing here imports them. See ``docs/architecture.md``.
"""
