"""vLLM general plugin (entry point ``vllm.general_plugins: pagedkv``): with
``PAGEDKV_VLLM=1`` in the environment, every vLLM engine whose ``scheduler_cls`` is unset
runs :class:`~pagedkv.vllm.PagedKVScheduler` (``PagedKVAsyncScheduler`` under async
scheduling). Without the variable the plugin does nothing: installing the extra never
changes vLLM by itself. vLLM loads general plugins in every process (front end and
engine core), so the choice holds wherever the scheduler is built.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ENV_VAR", "register"]

#: Set to 1 to make pagedkv the KV-cache manager of every vLLM engine in the process.
ENV_VAR = "PAGEDKV_VLLM"


def register() -> None:
    """The plugin function vLLM calls (idempotent)."""
    if os.environ.get(ENV_VAR, "") not in ("1", "true", "yes"):
        return
    from pagedkv.vllm.compat import require_vllm

    require_vllm()
    from vllm.config.scheduler import SchedulerConfig

    original = SchedulerConfig.get_scheduler_cls
    if getattr(original, "_pagedkv", False):
        return

    def get_scheduler_cls(self: Any) -> Any:
        if self.scheduler_cls is None:
            from pagedkv.vllm.scheduler import PagedKVAsyncScheduler, PagedKVScheduler

            return PagedKVAsyncScheduler if self.async_scheduling else PagedKVScheduler
        return original(self)

    get_scheduler_cls._pagedkv = True  # type: ignore[attr-defined]
    SchedulerConfig.get_scheduler_cls = get_scheduler_cls
