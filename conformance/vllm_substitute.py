"""pytest plugin (``-p conformance.vllm_substitute``): vLLM 0.33's scheduler tests run
with pagedkv as the KV-cache manager.

vLLM's tests build ``Scheduler`` / ``AsyncScheduler`` directly (or through their
``create_scheduler`` helper); this plugin binds those two names, in the modules that
define them, to subclasses of :class:`pagedkv.vllm.PagedKVScheduler` and
:class:`pagedkv.vllm.PagedKVAsyncScheduler` before any test module is imported, so each
test builds vLLM's own scheduler with pagedkv's manager installed by the same code
``--scheduler-cls`` runs. The subclasses only note which tests built one: with
``PAGEDKV_VLLM_BUILT=PATH`` the plugin writes their ids there (one a line), so the runner
can tell the cases that ran on pagedkv from those that never build a scheduler (they test
vLLM's manager or helpers directly). Used only by ``conformance/vllm_scheduler_tests.py``;
users pass ``scheduler_cls`` instead.
"""

from __future__ import annotations

import os
from typing import Any

import vllm.v1.core.sched.async_scheduler as _async_module
import vllm.v1.core.sched.scheduler as _sync_module

from pagedkv.vllm.scheduler import PagedKVAsyncScheduler, PagedKVScheduler

_current: list[str] = [""]
_built: set[str] = set()


class _NotedScheduler(PagedKVScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _built.add(_current[0])
        super().__init__(*args, **kwargs)


class _NotedAsyncScheduler(PagedKVAsyncScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _built.add(_current[0])
        super().__init__(*args, **kwargs)


_sync_module.Scheduler = _NotedScheduler  # type: ignore[misc]
_async_module.AsyncScheduler = _NotedAsyncScheduler  # type: ignore[misc]


def pytest_runtest_setup(item: Any) -> None:
    _current[0] = item.nodeid


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    path = os.environ.get("PAGEDKV_VLLM_BUILT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(f"{n}\n" for n in sorted(_built) if n)
