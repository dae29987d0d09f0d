"""The scheduler tests' setup: :mod:`pagedkv.vllm.harness` with the repository's copy of
facebook/opt-125m's public config.json (``conformance/data/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pagedkv.vllm import harness
from pagedkv.vllm.harness import make_requests, run

__all__ = ["build_scheduler", "make_requests", "run"]

CONFIG_JSON = Path(__file__).resolve().parents[2] / "conformance" / "data" / "opt-125m-config.json"


def build_scheduler(tmp: Path, scheduler_cls: Any, **kwargs: Any) -> Any:
    return harness.build_scheduler(harness.model_dir(CONFIG_JSON, tmp), scheduler_cls,
                                   **kwargs)
