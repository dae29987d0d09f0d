"""The roofline clock: one engine step's duration from the model, the GPU and the step's
real batch (every scheduled request's computed context).

Per step of ``T`` tokens over ``S`` sequences (vLLM runs one fused GEMM pass over the
mixed batch, grouped-GEMM kernels for routed experts and separate attention kernels,
so the parts add)::

    dense     = max(FLOPs / (peak x u(T)),  dense weight bytes / (HBM x e))
                FLOPs = 2 x (dense params - head) x T + 2 x head x S
                u(T) = u x T / (T + half)
    experts   = max(2 x top-k x expert x T / (peak x u_moe(T)),
                    touched experts(T) x expert bytes / (HBM x e_moe))   (MoE only)
                FP8 weights on an FP8 GPU: e_moe, u_moe = the fused-MoE kernels' own
                shares (ClockConstants.moe_fp8_*); otherwise e, u
    attention = sum over KV kinds of max(pair FLOPs / (KV-dtype peak x u), KV bytes / (HBM x e))
                full: a decode reads the whole context, a prefill chunk of n after c0
                      cached tokens does n x c0 + n(n+1)/2 pairs;
                window w / chunk k: the same over min(context, w) / the current chunk;
                cross: the encoder length; state (Mamba): the state read and written
    allreduce = 2 x layers x (latency + 2 (tp-1)/tp x T x hidden x 2 bytes / link)
    overhead  = step + layers x layer + S x seq

Contexts come from the engine's own requests: ``computed`` tokens (the prefix-cache hit
included — a hit saves the prefill FLOPs but its KV is still read).

Worked case, Llama-3.1-8B BF16 on one A100-40GB, one sequence decoding at 2,048 tokens::

    >>> from pagedkv.planner.gpus import find_gpu
    >>> from pagedkv.sim.clock.shape import model_shape
    >>> clock = RooflineStepModel.build(model_shape("Llama-3.1-8B"), find_gpu("A100-40GB"))
    >>> round(clock.step_time_s(0, 1) * 1e3, 1)   # 15.0 GB / (1.555 TB/s x 0.85) + ...
    12.3
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from pagedkv.planner.gpus import GpuSpec
from pagedkv.sim.clock.constants import CONSTANT_SETS, ClockConstants
from pagedkv.sim.clock.shape import ModelShape
from pagedkv.sim.scheduler import StepTimeModel

__all__ = ["TERMS", "RooflineStepModel"]

#: What a step's time is spent on (the ledger's order).
TERMS = ("weights", "compute", "KV reads", "overhead", "communication")
_W, _C, _KV, _O, _COMM = range(5)


class _Running(Protocol):
    computed: int


class _Rates(NamedTuple):
    """What a step's time is built from that does not change from step to step."""

    half_tokens: float
    dense_weight_s: float        # all dense weights once (seconds)
    dense_flops_per_token: float
    head_flops_per_seq: float
    dense_flops_s: float         # peak x u (before the ramp)
    expert_weight_s: float       # one routed expert once (seconds)
    expert_flops_per_token: float
    expert_flops_s: float
    inv_bw: float                # seconds per byte of KV
    inv_attn_flops_s: float
    allreduce_fixed_s: float
    allreduce_token_s: float
    overhead_fixed_s: float
    seq_overhead_s: float


def _rates(s: ModelShape, gpu: GpuSpec, c: ClockConstants) -> _Rates:
    bw = gpu.hbm_bytes_s * c.hbm_efficiency
    peak = gpu.peak_flops(weight_bytes_per_param=s.weight_bytes_per_param)
    fp8_math = s.weight_bytes_per_param <= 1.0 and gpu.fp8_tflops is not None
    # routed experts run in grouped-GEMM (fused-MoE) kernels: FP8 ones reach their own,
    # lower shares of the peaks (ClockConstants); BF16 ones a dense GEMM's
    moe_bw = gpu.hbm_bytes_s * (c.moe_fp8_hbm_efficiency if fp8_math else c.hbm_efficiency)
    moe_flops_s = peak * (c.moe_fp8_compute_utilization if fp8_math
                          else c.compute_utilization)
    # attention multiplies queries by the cached K and V: it runs at the KV dtype's
    # rate (BF16 unless the cache is FP8), whatever the weights are
    attn_flops_s = gpu.peak_flops(
        weight_bytes_per_param=float(s.kv_dtype_bytes)) * c.compute_utilization
    ar_calls = 2 * s.num_layers
    link = gpu.interconnect_bytes_s
    # a spec that measured its own GEMM ramp (a CPU) replaces the GPU default; the
    # ``ideal`` set's 0 (no ramp) stays a lower bound
    half = c.util_half_tokens
    if gpu.gemm_half_tokens is not None and half > 0.0:
        half = gpu.gemm_half_tokens
    return _Rates(
        half_tokens=half,
        dense_weight_s=s.dense_params * s.weight_bytes_per_param / bw,
        dense_flops_per_token=2.0 * (s.dense_params - s.head_params),
        head_flops_per_seq=2.0 * s.head_params,
        dense_flops_s=peak * c.compute_utilization,
        expert_weight_s=s.expert_params * s.weight_bytes_per_param / moe_bw,
        expert_flops_per_token=2.0 * s.top_k * s.expert_params,
        expert_flops_s=moe_flops_s,
        inv_bw=1.0 / bw,
        inv_attn_flops_s=1.0 / attn_flops_s,
        allreduce_fixed_s=ar_calls * c.allreduce_latency_s,
        allreduce_token_s=(ar_calls * 2.0 * (s.tp - 1) / s.tp * s.hidden_size * 2 / link
                           if s.tp > 1 else 0.0),
        overhead_fixed_s=c.step_overhead_s + s.num_layers * c.layer_overhead_s,
        seq_overhead_s=c.seq_overhead_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class RooflineStepModel(StepTimeModel):
    """The roofline clock (module docstring) for ``shape`` on ``gpu`` with ``constants``.

    It is a :class:`StepTimeModel` whose three linear figures are the roofline's slopes at
    ``typical_context_tokens`` (for a consumer that knows only token counts: the
    host-tier load policy's estimate, the clock's summary line); every engine step —
    one replica or many — is timed by :meth:`batch_time_s` on its real batch. Build it
    with :meth:`build`.
    """

    shape: ModelShape
    gpu: GpuSpec
    constants: ClockConstants = field(default_factory=lambda: CONSTANT_SETS["default"])
    typical_context_tokens: int = 2048
    _k: _Rates = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        StepTimeModel.__post_init__(self)
        object.__setattr__(self, "_k", _rates(self.shape, self.gpu, self.constants))

    @classmethod
    def build(cls, shape: ModelShape, gpu: GpuSpec, constants: ClockConstants | None = None,
              *, typical_context_tokens: int = 2048) -> RooflineStepModel:
        """The clock with its linear figures derived from the roofline."""
        c = constants or CONSTANT_SETS["default"]
        probe = cls(shape=shape, gpu=gpu, constants=c,
                    typical_context_tokens=max(1, typical_context_tokens))
        one = probe.step_time_s(0, 1)
        decode_seq_s = max(probe.step_time_s(0, 2) - one, 0.0)
        overhead_s = max(one - decode_seq_s, 1e-9)
        big = 4096
        prefill_token_s = max((probe.step_time_s(big, 0) - overhead_s) / big, 0.0)
        return cls(shape=shape, gpu=gpu, constants=c,
                   typical_context_tokens=probe.typical_context_tokens,
                   step_overhead_s=overhead_s, prefill_token_s=prefill_token_s,
                   decode_seq_s=decode_seq_s)

    @property
    def request_latency_s(self) -> float:
        """Client to engine, per request (:class:`ClockConstants`): the engine sees a
        request this long after it was sent, and its TTFT counts it."""
        return self.constants.request_latency_s

    # ------------------------------------------------------------------ the step

    def step_time_s(self, num_prefill_tokens: int, num_decode_seqs: int) -> float:
        """A step of ``num_prefill_tokens`` fresh prefill tokens (one chunk from position
        0) and ``num_decode_seqs`` sequences decoding at ``typical_context_tokens``."""
        ctx = self.typical_context_tokens
        prefill = [(0, num_prefill_tokens)] if num_prefill_tokens else []
        return self.time_of(decode_contexts=[ctx] * num_decode_seqs, prefill_chunks=prefill)

    def batch_time_s(self, decode: Sequence[_Running],
                     prefill: Sequence[tuple[_Running, int]],
                     ledger: list[float] | None = None) -> float:
        """The step of the engine's batch: ``decode`` requests (one token each at their
        ``computed`` context) and ``prefill`` (request, new tokens) chunks; adds the time
        per term (:data:`TERMS`) to ``ledger``."""
        return self.time_of(decode_contexts=[r.computed for r in decode],
                            prefill_chunks=[(r.computed, n) for r, n in prefill],
                            ledger=ledger)

    def time_of(self, *, decode_contexts: Sequence[int],
                prefill_chunks: Sequence[tuple[int, int]],
                ledger: list[float] | None = None) -> float:
        """The step time of decodes at ``decode_contexts`` (tokens already computed) and
        prefill chunks ``(cached tokens, new tokens)``."""
        s = self.shape
        k = self._k
        num_decode = len(decode_contexts)
        num_seqs = num_decode + len(prefill_chunks)
        tokens = num_decode + sum(n for _, n in prefill_chunks)
        terms = [0.0] * 5
        ramp = tokens / (tokens + k.half_tokens) if tokens else 1.0
        # dense GEMMs (attention projections, shared experts, the output head)
        weights_s = k.dense_weight_s
        compute_s = (k.dense_flops_per_token * tokens + k.head_flops_per_seq * num_seqs
                     ) / (k.dense_flops_s * ramp) if tokens else 0.0
        terms[_W if weights_s >= compute_s else _C] += max(weights_s, compute_s)
        if s.num_experts:  # routed experts: their own grouped-GEMM kernels
            weights_s = s.touched_experts(tokens) * k.expert_weight_s
            compute_s = k.expert_flops_per_token * tokens / (k.expert_flops_s * ramp) \
                if tokens else 0.0
            terms[_W if weights_s >= compute_s else _C] += max(weights_s, compute_s)
        for kind in s.attention:
            pairs, kv_tokens = _attention_work(kind.kind, kind.span, decode_contexts,
                                               prefill_chunks)
            a_bytes_s = (kv_tokens * kind.kv_bytes_per_token
                         + 2 * num_seqs * kind.state_bytes) * k.inv_bw
            a_flops_s = pairs * kind.flops_per_pair * k.inv_attn_flops_s
            terms[_KV if a_bytes_s >= a_flops_s else _C] += max(a_bytes_s, a_flops_s)
        if s.tp > 1:
            terms[_COMM] = k.allreduce_fixed_s + k.allreduce_token_s * tokens
        terms[_O] = k.overhead_fixed_s + num_seqs * k.seq_overhead_s
        if ledger is not None:
            for i in range(5):
                ledger[i] += terms[i]
        return sum(terms)

    def describe(self) -> str:
        """``roofline: <model> TP <n> on <gpu> (constants <name>)``."""
        return (f"roofline: {self.shape.name} TP {self.shape.tp} on {self.gpu.name} "
                f"(constants {self.constants.name})")


def _attention_work(kind: str, span: int | None, decode: Sequence[int],
                    prefill: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """(query-key pairs, KV tokens read) of one attention kind in a step."""
    if kind == "state":
        return 0.0, 0.0
    if kind == "full" or span is None:
        read = sum(decode) + len(decode)
        pairs = float(read)
        for c0, n in prefill:
            pairs += n * c0 + n * (n + 1) / 2
            read += c0 + n
        return pairs, float(read)
    if kind == "cross":
        read = span * (len(decode) + len(prefill))
        pairs = float(span * (len(decode) + sum(n for _, n in prefill)))
        return pairs, float(read)
    if kind == "window":
        read = sum(c + 1 if c < span else span for c in decode)
        pairs = float(read)
        for c0, n in prefill:
            pairs += n * min(c0 + (n + 1) / 2, span)
            read += min(c0, span) + n
        return pairs, float(read)
    # chunked local attention: the tokens of the current chunk
    read = sum(c % span + 1 for c in decode)
    pairs = float(read)
    for c0, n in prefill:
        pairs += n * min(c0 % span + (n + 1) / 2, span)
        read += c0 % span + n
    return pairs, float(read)
