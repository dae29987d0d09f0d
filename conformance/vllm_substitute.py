"""pytest plugin (``-p conformance.vllm_substitute``): vLLM 0.33's scheduler tests run
with pagedkv as the KV-cache manager.

vLLM's tests build ``Scheduler`` / ``AsyncScheduler`` directly (or through their
``create_scheduler`` helper); this plugin binds those two names, in the modules that
define them, to :class:`pagedkv.vllm.PagedKVScheduler` and
:class:`pagedkv.vllm.PagedKVAsyncScheduler` before any test module is imported, so each
test builds vLLM's own scheduler with pagedkv's manager installed by the same code
``--scheduler-cls`` runs. Used only by ``conformance/vllm_scheduler_tests.py``; users
pass ``scheduler_cls`` instead.
"""

from __future__ import annotations

import vllm.v1.core.sched.async_scheduler as _async_module
import vllm.v1.core.sched.scheduler as _sync_module

from pagedkv.vllm.scheduler import PagedKVAsyncScheduler, PagedKVScheduler

_sync_module.Scheduler = PagedKVScheduler  # type: ignore[misc]
_async_module.AsyncScheduler = PagedKVAsyncScheduler  # type: ignore[misc]
