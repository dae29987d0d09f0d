"""Measured per-request latencies for ``--calibrate``: ``vllm bench serve`` result JSON
(``--save-result``, with ``--save-detailed`` for per-request figures) and GuideLLM
result JSON.

What is read:

* ``vllm bench serve``: ``input_lens``, ``output_lens``, ``ttfts`` (s) and ``itls``
  (per request, s) plus ``max_concurrency`` (absent with ``request_rate`` "inf": every
  request at once, the concurrency is their number); a request's TPOT is the sum of its
  inter-chunk gaps over ``output_len - 1`` (vLLM's own definition, right when a server
  streams several tokens per chunk, as multi-step scheduling does: then its TTFT is the
  first *chunk's* and is not used, ``ttft_s`` 0, nor is the TPOT of an answer of fewer
  than 4 chunks); without the per-request lists, the
  aggregates ``completed``, ``total_input_tokens``, ``total_output_tokens``,
  ``mean_ttft_ms`` and ``mean_tpot_ms`` stand for one typical request. An optional
  ``arrival_s`` list (seconds from the run's start at which each request was sent, as
  ``benchmarks/cpu_engine_recording.py`` writes it) tells the replay when the streams
  started.
* GuideLLM: ``benchmarks[*].requests.successful[*]`` with ``prompt_tokens``,
  ``output_tokens``, ``time_to_first_token_ms`` and ``time_per_output_token_ms`` (or
  ``inter_token_latency_ms``); the concurrency is the benchmark's
  ``metrics.request_concurrency.mean``, else its strategy's ``streams``, else 1.

>>> import json, tempfile
>>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
...     json.dump({"max_concurrency": 2, "input_lens": [100], "output_lens": [3],
...                "ttfts": [0.02], "itls": [[0.01, 0.012]]}, f)
>>> m = load_measured(f.name)[0]
>>> m.input_tokens, m.output_tokens, m.concurrency, m.ttft_s, m.tpot_s
(100, 3, 2, 0.02, 0.011)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.errors import InputFileError
from pagedkv.input_files import load_document

__all__ = ["MAX_MEASURED_REQUESTS", "Measured", "load_measured"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """One measured request: its lengths, the run's concurrency, TTFT (0: not measured)
    and mean TPOT (inter-token latency; None with one output token). ``count`` > 1: it
    stands for that many identical requests whose mean TTFT and TPOT these are (a result
    file with aggregates only). ``sent_s``: when the request was sent, seconds from the
    run's start, where the file records it (None: not recorded)."""

    input_tokens: int
    output_tokens: int
    concurrency: int
    ttft_s: float
    tpot_s: float | None
    count: int = 1
    sent_s: float | None = None


#: A chunked stream's TPOT is trusted from this many gaps on: the split of a short
#: answer's tokens between its first chunk and the rest is unknown.
_MIN_CHUNKS = 4
#: The most requests one measured file may stand for (each is replayed in the simulator):
#: an aggregate's ``completed`` counts, so ``completed: 1e9`` is refused, not built.
MAX_MEASURED_REQUESTS = 100_000


def load_measured(path: str | Path) -> list[Measured]:
    """The measured requests of one result file (module docstring).

    Raises:
        InputFileError: unreadable, not JSON, neither format, a needed field missing, or
            a value that is not a finite number >= 0 (names the file and key).
    """
    p = Path(path)
    data: Any = load_document(p, what="measurements", fmt="json",
                              hint="; give a `vllm bench serve` --save-result "
                              "file or a GuideLLM result JSON")
    if isinstance(data, Mapping) and isinstance(data.get("benchmarks"), list):
        out = _guidellm(p, data["benchmarks"])
    elif isinstance(data, Mapping):
        out = _vllm_bench(p, data)
    else:
        raise InputFileError(str(p), "a result file is a JSON object (`vllm bench serve` or "
                             "GuideLLM)")
    if not out:
        raise InputFileError(str(p), "no successful request to fit to")
    total = sum(m.count for m in out)
    if total > MAX_MEASURED_REQUESTS:
        raise InputFileError(str(p), f"{total:,} requests to replay, more than the limit of "
                             f"{MAX_MEASURED_REQUESTS:,}; measure a shorter run (the fit needs "
                             "far fewer)", key="completed")
    return out


def _num(p: Path, value: Any, key: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0 or (positive and value <= 0):
        raise InputFileError(str(p), f"must be a finite number {'> 0' if positive else '>= 0'}"
                             f", got {value!r}", key=key)
    return float(value)


def _need(p: Path, data: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in data or data[key] is None:
        raise InputFileError(str(p), f"missing; {what}", key=key)
    return data[key]


def _vllm_bench(p: Path, data: Mapping[str, Any]) -> list[Measured]:
    conc_raw = data.get("max_concurrency")
    if conc_raw is not None:
        concurrency = int(_num(p, conc_raw, "max_concurrency", positive=True))
    elif str(data.get("request_rate")).lower() == "inf":  # all at once: the successful ones
        ttfts_raw = data.get("ttfts")
        n = sum(1 for t in ttfts_raw if t) if isinstance(ttfts_raw, list) else \
            data.get("completed", 1)
        concurrency = max(1, int(_num(p, n, "completed")))
    else:
        concurrency = 1
    if "ttfts" not in data:
        return [_vllm_aggregate(p, data, concurrency)]
    hint = "run `vllm bench serve --save-result --save-detailed`"
    ins = _need(p, data, "input_lens", hint)
    outs = _need(p, data, "output_lens", hint)
    ttfts = _need(p, data, "ttfts", hint)
    itls = _need(p, data, "itls", hint)
    if not all(isinstance(x, list) for x in (ins, outs, ttfts, itls)) or \
            not len(ins) == len(outs) == len(ttfts) == len(itls):
        raise InputFileError(str(p), "input_lens, output_lens, ttfts and itls must be lists "
                             "of one length", key="ttfts")
    sent = data.get("arrival_s")
    if sent is not None and (not isinstance(sent, list) or len(sent) != len(ins)):
        raise InputFileError(str(p), "arrival_s must be a list of seconds, one per request",
                             key="arrival_s")
    out = []
    for i, (n_in, n_out, ttft, itl) in enumerate(zip(ins, outs, ttfts, itls, strict=True)):
        if not ttft:  # a failed request has ttft 0
            continue
        if not isinstance(itl, list):
            raise InputFileError(str(p), f"request {i}: a list of seconds", key="itls")
        gaps = [_num(p, g, f"itls[{i}]") for g in itl]
        n_out_i = int(_num(p, n_out, f"output_lens[{i}]", positive=True))
        chunked = bool(gaps) and (n_out_i - 1) >= 2 * len(gaps)
        tpot = sum(gaps) / (n_out_i - 1) if gaps and n_out_i > 1 else None
        out.append(Measured(
            input_tokens=int(_num(p, n_in, f"input_lens[{i}]", positive=True)),
            output_tokens=n_out_i, concurrency=concurrency,
            ttft_s=0.0 if chunked else _num(p, ttft, f"ttfts[{i}]"),
            tpot_s=None if chunked and len(gaps) < _MIN_CHUNKS else tpot,
            sent_s=None if sent is None else _num(p, sent[i], f"arrival_s[{i}]")))
    return out


def _vllm_aggregate(p: Path, data: Mapping[str, Any], concurrency: int) -> Measured:
    hint = ("give per-request figures (`--save-detailed`: input_lens, output_lens, ttfts, "
            "itls) or the aggregates completed, total_input_tokens, total_output_tokens, "
            "mean_ttft_ms, mean_tpot_ms")
    completed = _num(p, _need(p, data, "completed", hint), "completed", positive=True)
    n_in = _num(p, _need(p, data, "total_input_tokens", hint), "total_input_tokens",
                positive=True)
    n_out = _num(p, _need(p, data, "total_output_tokens", hint), "total_output_tokens",
                 positive=True)
    ttft = _num(p, _need(p, data, "mean_ttft_ms", hint), "mean_ttft_ms") / 1e3
    tpot = _num(p, _need(p, data, "mean_tpot_ms", hint), "mean_tpot_ms") / 1e3
    return Measured(input_tokens=max(1, round(n_in / completed)),
                    output_tokens=max(1, round(n_out / completed)), concurrency=concurrency,
                    ttft_s=ttft, tpot_s=tpot, count=int(completed))


def _guidellm(p: Path, benchmarks: list[Any]) -> list[Measured]:
    out = []
    for b, bench in enumerate(benchmarks):
        if not isinstance(bench, Mapping):
            raise InputFileError(str(p), "each benchmark is an object", key=f"benchmarks[{b}]")
        concurrency = _guidellm_concurrency(p, bench, b)
        reqs = bench.get("requests")
        ok = reqs.get("successful") if isinstance(reqs, Mapping) else None
        if not isinstance(ok, list):
            raise InputFileError(str(p), "missing; GuideLLM results list each benchmark's "
                                 "successful requests", key=f"benchmarks[{b}].requests.successful")
        for i, r in enumerate(ok):
            where = f"benchmarks[{b}].requests.successful[{i}]"
            if not isinstance(r, Mapping):
                raise InputFileError(str(p), "a request is an object", key=where)
            tpot_key = ("time_per_output_token_ms" if r.get("time_per_output_token_ms")
                        is not None else "inter_token_latency_ms")
            need = "GuideLLM requests carry prompt_tokens, output_tokens, " \
                   "time_to_first_token_ms and time_per_output_token_ms"
            tpot = r.get(tpot_key)
            out.append(Measured(
                input_tokens=int(_num(p, _need(p, r, "prompt_tokens", need),
                                      f"{where}.prompt_tokens", positive=True)),
                output_tokens=int(_num(p, _need(p, r, "output_tokens", need),
                                       f"{where}.output_tokens", positive=True)),
                concurrency=concurrency,
                ttft_s=_num(p, _need(p, r, "time_to_first_token_ms", need),
                            f"{where}.time_to_first_token_ms") / 1e3,
                tpot_s=None if tpot is None else _num(p, tpot, f"{where}.{tpot_key}") / 1e3))
    return out


def _guidellm_concurrency(p: Path, bench: Mapping[str, Any], b: int) -> int:
    metrics = bench.get("metrics")
    if isinstance(metrics, Mapping):
        conc = metrics.get("request_concurrency")
        if isinstance(conc, Mapping) and conc.get("mean") is not None:
            mean = _num(p, conc["mean"], f"benchmarks[{b}].metrics.request_concurrency.mean")
            return max(1, round(mean))
    for key in ("args", "config"):
        section = bench.get(key)
        strategy = section.get("strategy") if isinstance(section, Mapping) else None
        if isinstance(strategy, Mapping) and strategy.get("streams") is not None:
            return max(1, int(_num(p, strategy["streams"], f"benchmarks[{b}].{key}.strategy"
                                                         ".streams", positive=True)))
    return 1

