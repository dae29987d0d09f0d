"""``--find-capacity``: how much KV memory, or how many replicas, bring TTFT p99 under a
target on this workload.

Two searches from the run's own settings, each an engine replay without bounds:

* **KV memory** (one replica): the smallest multiple of the KV-cache budget (×1.25 .. ×16:
  doubling, then two bisection steps) whose TTFT p99 meets the target. If even ×16 does
  not, the limit is compute, not memory.
* **Replicas** (same GPU each): requests dealt round-robin by session (a chained turn
  stays with its first turn) over R replicas, each an independent engine with its own
  cache (no cache-aware routing); the smallest R (2 .. 16) whose worst replica meets the
  target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pagedkv.errors import InvalidArgumentError
from pagedkv.sim.api import SimConfig, capacity_for
from pagedkv.sim.engine import EngineSimulator
from pagedkv.sim.results import percentile
from pagedkv.sim.workloads import SimRequest, Workload

__all__ = ["CapacitySearch", "find_capacity", "parse_seconds", "split_round_robin"]

SCALES = (2.0, 4.0, 8.0, 16.0)
REPLICAS = (2, 3, 4, 6, 8, 12, 16)


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacitySearch:
    """``memory_scale``: KV budget multiple that meets the target (None: none up to ×16);
    ``replicas``: replicas that meet it (None: none up to 16); ``tried``: (what, TTFT p99
    seconds) per replay, in order."""

    ttft_p99_target_s: float
    memory_scale: float | None
    num_blocks: int | None
    replicas: int | None
    tried: tuple[tuple[str, float | None], ...]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field; ``tried`` as ``{"what", "ttft_p99_s"}`` rows (a
        replay that met no TTFT, None or infinite, as None)."""
        return {
            "ttft_p99_target_s": self.ttft_p99_target_s,
            "memory_scale": self.memory_scale, "num_blocks": self.num_blocks,
            "replicas": self.replicas,
            "tried": [{"what": w, "ttft_p99_s": None if t is None or t == float("inf")
                       else t} for w, t in self.tried],
        }

    def summary(self) -> str:
        target = f"TTFT p99 <= {self.ttft_p99_target_s:g} s"
        if self.memory_scale == 1.0 and self.replicas == 1:
            return f"{target} is already met as configured"
        mem = (f"x{self.memory_scale:g} KV memory ({self.num_blocks:,} blocks)"
               if self.memory_scale is not None else "no KV size up to x16 (compute-bound)")
        rep = (f"{self.replicas} replicas" if self.replicas is not None
               else "more than 16 replicas")
        return f"to reach {target}: {mem} on one replica, or {rep} as configured"


def parse_seconds(text: str) -> float:
    """Seconds in ``text``: ``2s``, ``500ms``, ``2`` (seconds).

    Raises:
        InvalidArgumentError: not a positive duration.
    """
    t = text.strip().lower()
    scale = 1.0
    if t.endswith("ms"):
        t, scale = t[:-2], 1e-3
    elif t.endswith("s"):
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise InvalidArgumentError(f"--ttft-p99 {text!r} is not a positive duration; write "
                                   "e.g. 2s or 500ms")
    return value


def split_round_robin(workload: Workload, replicas: int) -> list[Workload]:
    """The workload dealt over ``replicas`` by session: root requests round-robin, each
    chained request with its root."""
    reqs = workload.requests
    owner = [0] * len(reqs)
    k = 0
    for i, r in enumerate(reqs):
        if r.parent is None:
            owner[i] = k % replicas
            k += 1
        else:
            owner[i] = owner[r.parent]
    parts: list[Workload] = []
    for rep in range(replicas):
        idx = [i for i in range(len(reqs)) if owner[i] == rep]
        new_index = {old: new for new, old in enumerate(idx)}
        sub: list[SimRequest] = []
        for i in idx:
            parent = reqs[i].parent
            sub.append(replace(reqs[i], parent=None if parent is None else new_index[parent]))
        parts.append(Workload(name=f"{workload.name}[{rep}/{replicas}]",
                              requests=tuple(sub),
                              source_block_size=workload.source_block_size,
                              description=workload.description))
    return parts


def _ttft_p99(workload: Workload, config: SimConfig) -> float | None:
    if not workload.requests:
        return 0.0
    cap = capacity_for(workload, config)
    res = EngineSimulator(workload, block_size=cap.block_size, num_blocks=cap.num_blocks,
                          config=config.scheduler, manager_factory=cap.factory).run()
    ttft = [f - a for a, f in zip(res.arrival_s, res.first_token_s, strict=True)
            if f is not None]
    if res.rejected:
        return math.inf
    return percentile(ttft, 99)


def find_capacity(
    workload: Workload,
    config: SimConfig,
    *,
    ttft_p99_s: float,
    baseline_ttft_p99_s: float | None = None,
    phase: Callable[[str], None] | None = None,
) -> CapacitySearch:
    """Search KV memory and replicas (module docstring) for TTFT p99 <= ``ttft_p99_s``.
    ``baseline_ttft_p99_s``: the run's own p99 if known (else it is replayed); when it
    already meets the target the answer is x1 and one replica.

    Raises:
        InvalidArgumentError: not engine mode.
    """
    if config.mode != "engine":
        raise InvalidArgumentError("--find-capacity needs --mode engine (TTFT is an engine "
                                   "figure)")
    say = phase or (lambda _s: None)
    tried: list[tuple[str, float | None]] = []
    base = baseline_ttft_p99_s
    if base is None:
        say("find capacity: as configured")
        base = _ttft_p99(workload, replace(config, bounds=False))
    tried.append(("as configured", base))
    if base is not None and base <= ttft_p99_s:
        return CapacitySearch(ttft_p99_target_s=ttft_p99_s, memory_scale=1.0,
                              num_blocks=capacity_for(workload, config).num_blocks,
                              replicas=1, tried=tuple(tried))

    def ok_memory(scale: float) -> bool:
        cfg = _scaled(config, scale, workload)
        say(f"find capacity: KV memory x{scale:g}")
        p99 = _ttft_p99(workload, cfg)
        tried.append((f"x{scale:g} KV memory", p99))
        return p99 is not None and p99 <= ttft_p99_s

    found: float | None = None
    lower = 1.0
    for scale in SCALES:
        if ok_memory(scale):
            found = scale
            break
        lower = scale
    if found is not None:
        for _ in range(2):
            mid = (lower + found) / 2
            if ok_memory(mid):
                found = mid
            else:
                lower = mid
    replicas: int | None = None
    for r in REPLICAS:
        say(f"find capacity: {r} replicas")
        worst = 0.0
        for part in split_round_robin(workload, r):
            p99 = _ttft_p99(part, config)
            worst = max(worst, math.inf if p99 is None else p99)
        tried.append((f"{r} replicas", worst))
        if worst <= ttft_p99_s:
            replicas = r
            break
    blocks = None
    if found is not None:
        blocks = capacity_for(workload, _scaled(config, found, workload)).num_blocks
    return CapacitySearch(ttft_p99_target_s=ttft_p99_s, memory_scale=found, num_blocks=blocks,
                          replicas=replicas, tried=tuple(tried))


def _scaled(config: SimConfig, scale: float, workload: Workload) -> SimConfig:
    if config.num_blocks is not None:
        return replace(config, num_blocks=max(2, int((config.num_blocks - 1) * scale) + 1),
                       bounds=False)
    return replace(config, memory_scale=config.memory_scale * scale, bounds=False)
