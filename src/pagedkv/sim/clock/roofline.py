"""The roofline clock: one engine step's duration from the model, the GPU and the step's
real batch (every scheduled request's computed context).

Per step of ``T`` tokens over ``S`` sequences (vLLM runs one fused GEMM pass over the
mixed batch and separate attention kernels, so the parts add)::

    dense     = max(FLOPs / (peak x u(T)),  weight bytes / (HBM x e))
                FLOPs = 2 x (active params - head) x T + 2 x head x S
                weight bytes = (dense params + touched experts(T) x expert) x bytes/param
                u(T) = u x T / (T + half)
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
from typing import Protocol

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


@dataclass(frozen=True, slots=True, kw_only=True)
class RooflineStepModel(StepTimeModel):
    """The roofline clock (module docstring) for ``shape`` on ``gpu`` with ``constants``.

    It is a :class:`StepTimeModel` whose three linear figures are the roofline's slopes at
    ``typical_context_tokens`` (what a consumer that knows only token counts — the
    replica engine, the host-tier load policy — uses); the engine calls
    :meth:`batch_time_s` with the real batch. Build it with :meth:`build`.
    """

    shape: ModelShape
    gpu: GpuSpec
    constants: ClockConstants = field(default_factory=lambda: CONSTANT_SETS["default"])
    typical_context_tokens: int = 2048

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
        c = self.constants
        num_decode = len(decode_contexts)
        num_seqs = num_decode + len(prefill_chunks)
        tokens = num_decode + sum(n for _, n in prefill_chunks)
        bw = self.gpu.hbm_bytes_s * c.hbm_efficiency
        peak = self.gpu.peak_flops(weight_bytes_per_param=s.weight_bytes_per_param)
        util = c.compute_utilization * tokens / (tokens + c.util_half_tokens) if tokens else 1.0
        flops = 2.0 * ((s.active_params - s.head_params) * tokens + s.head_params * num_seqs)
        touched = s.dense_params + s.touched_experts(tokens) * s.expert_params
        weights_s = touched * s.weight_bytes_per_param / bw
        compute_s = flops / (peak * util) if tokens else 0.0
        terms = [0.0] * 5
        terms[_W if weights_s >= compute_s else _C] += max(weights_s, compute_s)
        # attention multiplies queries by the cached K and V: it runs at the KV dtype's
        # rate (BF16 unless the cache is FP8), whatever the weights are
        attn_peak = self.gpu.peak_flops(
            weight_bytes_per_param=float(s.kv_dtype_bytes)) * c.compute_utilization
        for kind in s.attention:
            pairs, kv_bytes = _attention_work(kind.kind, kind.span, decode_contexts,
                                              prefill_chunks)
            a_bytes_s = (kv_bytes * kind.kv_bytes_per_token
                         + 2 * num_seqs * kind.state_bytes) / bw
            a_flops_s = pairs * kind.flops_per_pair / attn_peak
            terms[_KV if a_bytes_s >= a_flops_s else _C] += max(a_bytes_s, a_flops_s)
        if s.tp > 1:
            link = self.gpu.interconnect_bytes_s
            msg = 2.0 * (s.tp - 1) / s.tp * tokens * s.hidden_size * 2
            terms[_COMM] = 2 * s.num_layers * (c.allreduce_latency_s + msg / link)
        terms[_O] = (c.step_overhead_s + s.num_layers * c.layer_overhead_s
                     + num_seqs * c.seq_overhead_s)
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
