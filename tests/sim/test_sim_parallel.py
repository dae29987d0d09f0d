"""The bounds worker process: its value, its errors, and a caller that never asks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pagedkv.errors import InvalidArgumentError
from pagedkv.sim import parallel
from pagedkv.sim.generators import GENERATORS


def _workload():  # type: ignore[no-untyped-def]
    return GENERATORS["multi-turn"](num_conversations=4)


def test_background_bounds_equal_the_in_process_ones() -> None:
    wl = _workload()
    kw = dict(indices=None, with_outputs=False, semantics="vllm")
    here = parallel.bounds_in_background(wl, 16, 50, jobs=1, **kw)()  # type: ignore[arg-type]
    there = parallel.bounds_in_background(wl, 16, 50, jobs=2, **kw)()  # type: ignore[arg-type]
    assert there == here


def test_a_worker_error_is_raised_in_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_args: object) -> None:
        raise InvalidArgumentError("bad bounds input")

    monkeypatch.setattr(parallel, "_bounds", boom)  # the forked child inherits it
    job = parallel.bounds_in_background(_workload(), 16, 50, indices=None,
                                        with_outputs=False, semantics="vllm", jobs=2)
    with pytest.raises(InvalidArgumentError, match="bad bounds input"):
        job()


def test_an_abandoned_worker_exits_quietly_with_the_caller() -> None:
    code = (
        "from pagedkv.sim import parallel\n"
        "from pagedkv.sim.generators import GENERATORS\n"
        "wl = GENERATORS['multi-turn'](num_conversations=200, num_turns=10)\n"
        "parallel.bounds_in_background(wl, 16, 50, indices=None, with_outputs=True,\n"
        "                              semantics='vllm', jobs=2)\n"
        "raise SystemExit(1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert proc.stderr == ""
