"""The adapter's per-step calls in C (``VllmEntry``, ``pagedkv/_csrc/ccore_vllm.h``).

With the compiled core, :class:`pagedkv.vllm.manager.VLLMKVCacheManager` answers vLLM's
steady-state ``allocate_slots(request, n, num_lookahead_tokens=0)`` and
``cache_blocks(request, n)`` in C and gives every other call, unchanged, to its Python
methods (the specification). Checked here: whole runs schedule exactly as with the Python
methods (sync and async; full attention, a window, a Mamba hybrid); only admissions reach
the Python ``allocate_slots``; the calls the entry leaves alone (a zero count, another
request object under a held id, an admitting request under a watermark) reach Python and
raise its errors; with KV-cache events the entry is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (pip install 'pagedkv[vllm]')")

from vllm_sched_support import build_scheduler, make_requests, run

from pagedkv.core import native

pytestmark = pytest.mark.skipif(native.active() is None,
                                reason="the compiled core is not in use")

NUM_REQUESTS = 12


def _scheduler(tmp: Path, overlap: bool, **kwargs: Any) -> Any:
    from pagedkv.vllm import PagedKVAsyncScheduler, PagedKVScheduler

    cls = PagedKVAsyncScheduler if overlap else PagedKVScheduler
    kwargs.setdefault("window", None)
    return build_scheduler(tmp, cls, async_scheduling=overlap, **kwargs)


def _without_entry(s: Any) -> Any:
    """The scheduler's adapter with its Python methods back (the entry removed)."""
    kv = s.kv_cache_manager
    for name in ("allocate_slots", "cache_blocks"):
        kv.__dict__.pop(name, None)
    return s


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("layout", ["full", "full+swa", "full+mamba"])
def test_runs_schedule_as_the_python_methods(tmp_path: Path, layout: str,
                                             overlap: bool) -> None:
    kwargs: dict[str, Any] = {"num_blocks": 120, "window": 32 if "swa" in layout else None,
                              "mamba": "mamba" in layout}
    compiled = _scheduler(tmp_path / "c", overlap, **kwargs)
    kv = compiled.kv_cache_manager
    assert type(kv.allocate_slots).__name__ == "builtin_function_or_method"
    python = _without_entry(_scheduler(tmp_path / "p", overlap, **kwargs))
    reqs = dict(shared=32, max_tokens=20)
    a = run(compiled, make_requests(NUM_REQUESTS, **reqs), overlap=overlap)
    b = run(python, make_requests(NUM_REQUESTS, **reqs), overlap=overlap)
    assert a.steps == b.steps
    # The pool is tight enough that some requests wait or are preempted on the way.
    assert any(step.get("preempted") for step in a.steps) or len(a.steps) > 2 * 20


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_only_admissions_reach_python(tmp_path: Path, overlap: bool,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedkv.vllm.manager import VLLMKVCacheManager

    seen = {"allocate_slots": 0, "cache_blocks": 0}
    for name in seen:
        method = getattr(VLLMKVCacheManager, name)

        def counted(self: Any, *args: Any, _m: Any = method, _n: str = name,
                    **kwargs: Any) -> Any:
            seen[_n] += 1
            return _m(self, *args, **kwargs)

        monkeypatch.setattr(VLLMKVCacheManager, name, counted)
    s = _scheduler(tmp_path, overlap, num_blocks=400)  # roomy: no preemption
    run(s, make_requests(NUM_REQUESTS, max_tokens=24), overlap=overlap)
    assert seen["allocate_slots"] == NUM_REQUESTS  # each request's first allocation
    assert seen["cache_blocks"] == 0


def test_calls_the_entry_leaves_reach_python_and_its_errors(tmp_path: Path) -> None:
    from vllm.v1.request import RequestStatus

    from pagedkv.vllm.entry import install_entry

    s = _scheduler(tmp_path, False, num_blocks=400)
    reqs = make_requests(2, max_tokens=4)
    s.add_request(reqs[0])
    out = s.schedule()
    assert out.num_scheduled_tokens
    kv = s.kv_cache_manager
    req = s.requests[reqs[0].request_id]
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
        kv.allocate_slots(req, 0)
    # A keyword the entry does not take: the Python method, the same answer.
    before = kv.get_block_ids(req.request_id)
    assert kv.allocate_slots(req, 1, num_lookahead_tokens=0) is kv.empty_kv_cache_blocks
    assert kv.allocate_slots(req, 1, reserved_blocks=0) is kv.empty_kv_cache_blocks
    assert kv.get_block_ids(req.request_id) == before
    # An admitting request under a watermark counts it: the Python method decides.
    kv.watermark_blocks = kv.pagedkv.num_free_blocks  # nothing can be admitted now
    install_entry(kv, (RequestStatus.WAITING, RequestStatus.PREEMPTED))
    req.status = RequestStatus.PREEMPTED
    assert kv.allocate_slots(req, 64) is None
    req.status = RequestStatus.RUNNING
    assert kv.allocate_slots(req, 1) is kv.empty_kv_cache_blocks


def test_not_installed_with_kv_events(tmp_path: Path) -> None:
    s = _scheduler(tmp_path, False, num_blocks=400, kv_events=True)
    kv = s.kv_cache_manager
    assert "allocate_slots" not in kv.__dict__ and "cache_blocks" not in kv.__dict__
