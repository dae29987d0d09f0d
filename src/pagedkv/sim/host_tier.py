"""The host-memory tier in the simulator: sizes, transfer costs, the load-or-recompute
decision, and what a run measured per tier.

``pagedkv simulate --host-memory 256GiB --host-bandwidth-gbps 25`` gives the simulated
engine a second, larger KV-cache tier in CPU memory (:mod:`pagedkv.host`): blocks evicted
from the device are stored there, and a lookup that runs past the device hit continues in
it. The engine (:mod:`pagedkv.sim.host_engine`) executes the tier's plans in simulated
time:

* **Size.** ``--host-memory`` is bytes; host blocks = bytes // bytes per block. Bytes per
  block come from the planner: one page per KV-cache tensor (``page_size_bytes x
  tensors``; Llama-3.1-8B in BF16 at block size 16: 64 KiB x 32 = 2 MiB). Without a model
  (``--num-blocks``) the figure is :data:`NO_MODEL_BYTES_PER_TOKEN` per token of a block
  (the same Llama-3.1-8B figure), so 256 GiB hold 2,097,152 tokens either way.
* **Loads** (host -> device) take ``blocks x bytes per block / bandwidth`` and are added
  to the step that admits the request (the step waits for its copies, as a synchronous
  layer-by-layer load would). **Stores** (device -> host, one per evicted block) use the
  other direction of the link: they overlap the step and lengthen it only when they need
  longer than it (``step = max(compute + loads, stores)``).
* **Load or recompute**, per request (:class:`CostBasedLoad`): the host part of a hit is
  loaded only when its transfer is cheaper than prefilling those tokens at the step
  model's ``prefill_token_s``; otherwise the request takes its device hit only and
  recomputes the rest. At the defaults (2 MiB blocks of 16 tokens, 25 GB/s, 20 µs per
  prefill token) a load costs 5.2 µs per token, a quarter of recomputing it.

``--host-bandwidth-gbps`` is in GB/s (10^9 bytes per second) per direction; the default
:data:`DEFAULT_BANDWIDTH_GBPS` is a PCIe 5.0 x16 link's practical pinned-memory copy rate
for one GPU, rounded down.

>>> cfg = HostMemoryConfig(memory_bytes=256 << 30)
>>> cost = TransferCost(block_bytes=2 << 20, bandwidth_gbps=cfg.bandwidth_gbps)
>>> cfg.num_blocks(cost.block_bytes), round(cost.seconds(1) * 1e6, 1)
(131072, 83.9)
>>> CostBasedLoad().worth_loading(num_tokens=16, num_blocks=1, cost=cost, prefill_token_s=20e-6)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pagedkv.checks import check_flag, check_number, check_whole
from pagedkv.errors import InvalidArgumentError
from pagedkv.planner import format_bytes, parse_bytes

__all__ = [
    "DEFAULT_BANDWIDTH_GBPS",
    "NO_MODEL_BYTES_PER_TOKEN",
    "WRITE_POLICIES",
    "AlwaysLoad",
    "CostBasedLoad",
    "HostMemoryConfig",
    "HostRunStats",
    "HostSweepRow",
    "LoadPolicy",
    "TransferCost",
    "parse_host_sizes",
]

#: Host-tier write policies (:mod:`pagedkv.host.policy`).
WRITE_POLICIES = ("on-eviction", "write-through")
#: GB/s (10^9 bytes/s) per direction between host memory and one GPU.
DEFAULT_BANDWIDTH_GBPS = 25.0
#: Bytes of KV per token when no model sizes the pool: Llama-3.1-8B in BF16
#: (32 layers x K and V x 8 KV heads x 128 x 2 bytes).
NO_MODEL_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2


@dataclass(frozen=True, slots=True, kw_only=True)
class HostMemoryConfig:
    """A host tier of ``memory_bytes`` (at least one block) linked at ``bandwidth_gbps``
    per direction; ``write_policy``: ``"on-eviction"`` (store a block when the device
    evicts it: the copy delays the step that reuses the block) or ``"write-through"``
    (store every block as the device caches it: the copy overlaps the next step);
    ``sweep_memory_bytes``: further host sizes to replay for the host-memory table;
    ``device_only_baseline``: also replay without the host tier (the table's first row:
    the TTFT and hit-rate effect of the tier).

    Raises:
        InvalidArgumentError: a size below 1 byte, or a bandwidth that is not > 0.
    """

    memory_bytes: int
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS
    write_policy: str = "on-eviction"
    sweep_memory_bytes: tuple[int, ...] = ()
    device_only_baseline: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.sweep_memory_bytes, tuple):
            raise InvalidArgumentError(
                f"HostMemoryConfig.sweep_memory_bytes must be a tuple of sizes, got "
                f"{self.sweep_memory_bytes!r}")
        for size in (self.memory_bytes, *self.sweep_memory_bytes):
            check_whole("--host-memory", size, minimum=1,
                        hint="; give a positive size such as 256GiB")
        check_flag("HostMemoryConfig.device_only_baseline", self.device_only_baseline)
        if self.write_policy not in WRITE_POLICIES:
            raise InvalidArgumentError(
                f"--host-write-policy must be one of {WRITE_POLICIES}, got "
                f"{self.write_policy!r}")
        check_number("--host-bandwidth-gbps", self.bandwidth_gbps, minimum=0,
                     minimum_exclusive=True, maximum=1e6)

    def num_blocks(self, block_bytes: int) -> int:
        """Host blocks of ``block_bytes`` each that ``memory_bytes`` holds."""
        return self.memory_bytes // block_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferCost:
    """Seconds to move whole blocks of ``block_bytes`` over one direction of the link."""

    block_bytes: int
    bandwidth_gbps: float

    def seconds(self, num_blocks: int) -> float:
        return num_blocks * self.block_bytes / (self.bandwidth_gbps * 1e9)


class LoadPolicy(Protocol):
    """Decides, per request, whether the host part of its hit is loaded or recomputed."""

    def worth_loading(self, *, num_tokens: int, num_blocks: int, cost: TransferCost,
                      prefill_token_s: float) -> bool: ...


class CostBasedLoad:
    """Load when the copy is faster than prefilling the same tokens (the default)."""

    def worth_loading(self, *, num_tokens: int, num_blocks: int, cost: TransferCost,
                      prefill_token_s: float) -> bool:
        return cost.seconds(num_blocks) < num_tokens * prefill_token_s


class AlwaysLoad:
    """Load every host hit, whatever it costs (to measure what the decision saves)."""

    def worth_loading(self, *, num_tokens: int, num_blocks: int, cost: TransferCost,
                      prefill_token_s: float) -> bool:
        return True


@dataclass(slots=True, kw_only=True)
class HostRunStats:
    """What the host tier did in one run (token counts over first lookups of admitted
    requests, like the report's hit rate; blocks and seconds over the whole run).

    ``device_hit_tokens + host_hit_tokens`` is the run's ``hit_tokens``;
    ``declined_host_tokens`` were found in host memory but recomputed (cheaper).
    """

    memory_bytes: int
    block_bytes: int
    num_blocks: int
    bandwidth_gbps: float
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    declined_host_tokens: int = 0
    loads: int = 0
    loaded_blocks: int = 0
    stored_blocks: int = 0
    load_s: float = 0.0
    store_stall_s: float = 0.0

    def lines(self, prompt_tokens: int) -> list[tuple[str, str]]:
        """Report rows (label, value) for a run of ``prompt_tokens`` prompt tokens."""
        def pct(x: int) -> str:
            return f"{100 * x / prompt_tokens:.1f} %" if prompt_tokens else "—"

        gb = self.block_bytes / 1e9
        return [
            ("host memory", f"{format_bytes(self.memory_bytes)} = {self.num_blocks:,} blocks "
             f"of {format_bytes(self.block_bytes)}, {self.bandwidth_gbps:g} GB/s per direction"),
            ("hit tokens: device / host",
             f"{pct(self.device_hit_tokens)} / {pct(self.host_hit_tokens)}  "
             f"({self.device_hit_tokens:,} / {self.host_hit_tokens:,} tokens)"),
            ("host hits recomputed (cheaper than loading)",
             f"{self.declined_host_tokens:,} tokens"),
            ("loads / loaded", f"{self.loads:,} requests / {self.loaded_blocks:,} blocks "
             f"({self.loaded_blocks * gb:,.1f} GB) in {self.load_s:.2f} s"),
            ("stored (device -> host)", f"{self.stored_blocks:,} blocks "
             f"({self.stored_blocks * gb:,.1f} GB); steps waited "
             f"{self.store_stall_s:.2f} s for stores"),
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSweepRow:
    """One host size's replay (``host_memory_bytes`` None: device only). Rates are
    fractions of prompt tokens of admitted requests; TTFT in seconds."""

    host_memory_bytes: int | None
    host_blocks: int
    hit_rate: float
    device_hit_rate: float
    host_hit_rate: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    preemptions: int


def parse_host_sizes(text: str) -> tuple[int, ...]:
    """``--host-memory``: one size or several, comma-separated (``64GiB,256GiB``).

    Raises:
        InvalidArgumentError: a part that is not a size, or a size of 0.
    """
    sizes = []
    for part in text.split(","):
        size = parse_bytes(part.strip(), what="--host-memory")
        if size < 1:
            raise InvalidArgumentError(f"--host-memory {part.strip()!r}: give a size above 0")
        sizes.append(size)
    return tuple(sizes)
