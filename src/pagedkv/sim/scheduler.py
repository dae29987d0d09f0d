"""Engine-mode settings and the pieces an engine replica is built from: the step-time
model, the scheduler knobs, the manager factory (one full-attention group by default; a
hybrid model's groups via :mod:`pagedkv.sim.models`) and the manager request of a
workload request. The engine itself is :mod:`pagedkv.sim.engine`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pagedkv import FullAttentionSpec, InvalidArgumentError, KVCacheManager, Request
from pagedkv.checks import check_flag, check_number, check_whole
from pagedkv.cli_args import MAX_SECONDS
from pagedkv.events.config import KVEventsConfig
from pagedkv.sim.results import SimResult
from pagedkv.sim.workloads import SimRequest, Workload, check_block_size, request_block_hashes

__all__ = [
    "EngineResult",
    "LiveRequest",
    "SchedulerConfig",
    "StepTimeModel",
    "build_manager",
    "request_blocks_needed",
]

EngineResult = SimResult

#: Progress callback: (requests finished or rejected, total requests).
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimeModel:
    """Duration of one engine step::

        step_time_s = step_overhead_s
                      + prefill_token_s * (prefill tokens computed in the step)
                      + decode_seq_s * (sequences decoding one token in the step)

    Defaults are round figures for an 8B-parameter model in BF16 on one 80 GB H100-class
    GPU (the default capacity of ``pagedkv simulate`` is the planner's for that setup):
    4 ms per step (reading the weights once), 20 µs per prefill token (50,000 prefill
    tokens/s), 0.1 ms per decoding sequence. Prefix-cache hits are not computed, so they
    cost nothing. Change them to match your hardware; read the shape of queueing and TTFT
    from the defaults, not their absolute values.
    """

    step_overhead_s: float = 0.004
    prefill_token_s: float = 20e-6
    decode_seq_s: float = 0.1e-3

    def __post_init__(self) -> None:
        for name in ("step_overhead_s", "prefill_token_s", "decode_seq_s"):
            check_number(f"StepTimeModel.{name}", getattr(self, name), minimum=0,
                         maximum=MAX_SECONDS)
        if self.step_overhead_s + self.prefill_token_s + self.decode_seq_s <= 0:
            raise InvalidArgumentError("a step must take some time: all step costs are 0")

    def step_time_s(self, num_prefill_tokens: int, num_decode_seqs: int) -> float:
        return (
            self.step_overhead_s
            + self.prefill_token_s * num_prefill_tokens
            + self.decode_seq_s * num_decode_seqs
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Engine-mode knobs (module docstring). ``token_budget``: tokens computed per step
    (vLLM's ``max_num_batched_tokens``); ``max_running``: ``max_num_seqs``;
    ``max_model_len``: a request whose prompt + output is longer is rejected on arrival,
    as vLLM's server refuses it (None: no limit but the cache's)."""

    token_budget: int = 8192
    max_running: int = 256
    arrivals: str = "trace"
    rate_scale: float = 1.0
    step_time: StepTimeModel = field(default_factory=StepTimeModel)
    num_samples: int = 400
    check_invariants_every_step: bool = False
    kv_events: KVEventsConfig | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        check_whole("SchedulerConfig.token_budget", self.token_budget, minimum=1)
        if self.max_model_len is not None:
            check_whole("SchedulerConfig.max_model_len", self.max_model_len, minimum=1)
        check_whole("SchedulerConfig.max_running", self.max_running, minimum=1)
        check_whole("SchedulerConfig.num_samples", self.num_samples, minimum=1)
        check_flag("SchedulerConfig.check_invariants_every_step",
                   self.check_invariants_every_step)
        if not isinstance(self.step_time, StepTimeModel):
            raise InvalidArgumentError(
                f"SchedulerConfig.step_time must be a StepTimeModel, got {self.step_time!r}")
        if self.kv_events is not None and not isinstance(self.kv_events, KVEventsConfig):
            raise InvalidArgumentError(
                f"SchedulerConfig.kv_events must be a KVEventsConfig or None, got "
                f"{self.kv_events!r}")
        if self.arrivals not in ("trace", "at-once"):
            raise InvalidArgumentError(
                f"arrivals must be 'trace' or 'at-once', got {self.arrivals!r}"
            )
        check_number("SchedulerConfig.rate_scale", self.rate_scale, minimum=0,
                     minimum_exclusive=True, maximum=1e6)


class ManagerFactory(Protocol):
    """Builds the manager a simulation runs on (:func:`build_manager` is the default; a
    hybrid model's factory builds every group, :mod:`pagedkv.sim.models`)."""

    def __call__(
        self,
        workload: Workload,
        *,
        block_size: int,
        num_blocks: int,
        kv_events: KVEventsConfig | None = None,
    ) -> KVCacheManager: ...


def request_blocks_needed(r: SimRequest, block_size: int) -> int:
    """Blocks the request holds at its largest: ``ceil((prompt + output - 1) / b)``."""
    total = r.num_prompt_tokens + max(1, r.num_output_tokens) - 1
    return -(-total // block_size)


def workload_max_len(workload: Workload, block_size: int) -> int:
    """``max_model_len`` for replaying ``workload``: its longest prompt + output, and room
    for a prompt padded to whole blocks plus one token (reference semantics)."""
    return max(
        (max(r.num_prompt_tokens + max(1, r.num_output_tokens),
             -(-r.num_prompt_tokens // block_size) * block_size + 1)
         for r in workload.requests),
        default=1,
    )


def build_manager(
    workload: Workload,
    *,
    block_size: int,
    num_blocks: int,
    kv_events: KVEventsConfig | None = None,
) -> KVCacheManager:
    """A one-group full-attention manager sized for ``workload`` (``max_model_len`` = its
    longest prompt + output), SHA-256 hashing of generated tokens; KV-cache events are
    published per ``kv_events`` (off by default).

    Raises:
        InvalidArgumentError: a block size the workload's hashes cannot be replayed at, or
            fewer than 2 blocks.
    """
    check_block_size(block_size, workload.source_block_size)
    if num_blocks < 2:
        raise InvalidArgumentError(
            f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}"
        )
    max_len = workload_max_len(workload, block_size)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128,
                             dtype_bytes=2)
    return KVCacheManager.from_spec(spec, num_blocks=num_blocks, max_model_len=max_len,
                                    kv_events=kv_events)


def make_request(
    mgr: KVCacheManager,
    workload: Workload,
    index: int,
    block_size: int,
    *,
    num_tokens: int | None = None,
    num_hashed_blocks: int | None = None,
) -> Request:
    """The manager request for ``workload.requests[index]`` (hashes per workloads.py).
    ``num_tokens`` / ``num_hashed_blocks``: placeholder prompt length and hashed blocks
    other than the prompt's (reference semantics, :mod:`pagedkv.sim.semantics`)."""
    r = workload.requests[index]
    hashes = request_block_hashes(
        r, block_size, source_block_size=workload.source_block_size, index=index,
        num_blocks=num_hashed_blocks,
    )
    if r.prompt_token_ids is not None:
        return mgr.new_request(r.request_id, r.prompt_token_ids, block_hashes=hashes)
    n = r.num_prompt_tokens if num_tokens is None else num_tokens
    # Placeholder tokens: no hasher; the engine appends a unique key per block that fills
    # while decoding (decode_block_key), which is what hashing unique tokens would give.
    return Request(r.request_id, [0] * n, block_hashes=hashes)


def decode_block_key(index: int, block: int) -> bytes:
    """The block hash of block ``block`` of placeholder request ``index`` past its supplied
    hashes: unique to the request (never shared), and cheaper than hashing its tokens."""
    return b"\x00sim-decode" + index.to_bytes(8, "little") + block.to_bytes(4, "little")


class LiveRequest:
    """A request inside the engine.

    ``computed`` and ``num_tokens`` are the engine's view; output tokens are pushed to the
    manager's request (and its block hashes extended) lazily, by :meth:`sync`, before any
    manager call that reads it — so a decode step that needs no manager call costs a few
    integer operations.
    """

    __slots__ = (
        "blocked_at", "computed", "first_scheduled", "generated", "index", "key_block_size",
        "num_tokens",
        "outputs", "pushed", "req", "target",
    )

    def __init__(self, index: int, req: Request, sim: SimRequest, block_size: int) -> None:
        self.index = index
        self.req = req
        #: placeholder tokens: block keys are appended here, not hashed by a hasher
        self.key_block_size = block_size if sim.prompt_token_ids is None else 0
        self.target = max(1, sim.num_output_tokens)
        self.generated = 0
        self.pushed = 0
        self.computed = 0
        self.num_tokens = req.num_tokens
        self.outputs = sim.output_token_ids
        self.first_scheduled = False
        #: Free blocks when its admission last failed (None: not blocked).
        self.blocked_at: int | None = None

    def sync(self) -> Request:
        """Push pending output tokens and the computed count to the manager's request."""
        req = self.req
        if self.pushed < self.generated:
            a, b = self.pushed, self.generated
            outs = self.outputs
            if outs is None:
                req.append_output_tokens([self.index + 1] * (b - a))  # unique per request
                kbs = self.key_block_size
                if kbs:
                    hashes = req.block_hashes
                    for k in range(len(hashes), req.num_tokens // kbs):
                        hashes.append(decode_block_key(self.index, k))
            else:
                req.append_output_tokens(
                    [outs[k] if k < len(outs) else self.index + 1 for k in range(a, b)]
                )
            self.pushed = b
        req.num_computed_tokens = self.computed
        return req
