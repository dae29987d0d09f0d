"""A sweep's rows: one per point, its inputs, figures, cost and SLO verdict; written as
CSV, JSON and (with ``pyarrow``) Parquet.

**Cost**: GPUs used (``replicas × tp``) × the GPU's price per hour, from
:data:`DEFAULT_PRICES_USD_PER_GPU_HOUR` (indicative on-demand cloud prices; sources in
``docs/sweep.md``) or a file the user gives (:func:`load_prices`: a JSON or TOML mapping
of GPU name to US dollars per GPU-hour, overriding and adding to the defaults). A GPU
without a price has no cost (the row says so). ``usd_per_m_output_tokens`` divides the
hourly cost by the output tokens an hour of the simulated traffic produced.

**SLO**: a point meets it when it rejected nothing, its TTFT p99 is at most
``ttft_p99_s`` and its TPOT p99 at most ``tpot_p99_ms`` (a figure the run lacks, as in
pure-cache mode, fails).

>>> slo = Slo(ttft_p99_s=2.0, tpot_p99_ms=50.0)
>>> slo.met({"ttft_p99_s": 1.5, "tpot_p99_s": 0.04, "rejected": 0})
True
>>> slo.met({"ttft_p99_s": 1.5, "tpot_p99_s": 0.06, "rejected": 0})
False
"""

from __future__ import annotations

import csv
import importlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.errors import InputFileError, InvalidArgumentError
from pagedkv.input_files import load_document
from pagedkv.planner.gpus import DEFAULT_GPU, resolve_gpu
from pagedkv.sweep.point import METRICS

__all__ = ["DEFAULT_PRICES_USD_PER_GPU_HOUR", "EXCLUDED_FROM_COMPARISON", "Slo",
           "build_row", "comparable", "gpu_name", "load_prices", "write_rows"]

#: US dollars per GPU-hour, on demand (indicative; docs/sweep.md gives the sources).
DEFAULT_PRICES_USD_PER_GPU_HOUR: dict[str, float] = {
    "A100-40GB": 1.29, "A100-80GB": 1.79, "H100-SXM": 2.99, "H100-PCIe": 2.49,
    "H200": 3.79, "B200": 4.99, "L40S": 1.25, "MI300X": 2.49,
}
#: Row columns that depend on where and when a point ran, not on its inputs.
EXCLUDED_FROM_COMPARISON = ("wall_s", "cached")


@dataclass(frozen=True, slots=True)
class Slo:
    """The service-level objective a point must meet (module docstring)."""

    ttft_p99_s: float = 2.0
    tpot_p99_ms: float = 50.0

    def __post_init__(self) -> None:
        for name, value in (("--slo-ttft-p99-s", self.ttft_p99_s),
                            ("--slo-tpot-p99-ms", self.tpot_p99_ms)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise InvalidArgumentError(f"{name} must be a positive number, got {value!r}")

    def met(self, metrics: Mapping[str, Any]) -> bool:
        ttft, tpot = metrics.get("ttft_p99_s"), metrics.get("tpot_p99_s")
        return (ttft is not None and tpot is not None and not metrics.get("rejected")
                and ttft <= self.ttft_p99_s and tpot * 1e3 <= self.tpot_p99_ms)


def load_prices(path: str | Path | None) -> dict[str, float]:
    """The price table: the defaults, overridden by ``path`` (JSON or TOML object of GPU
    name -> USD per GPU-hour) when given.

    Raises:
        InputFileError: unreadable, not an object, a price that is not a positive number.
    """
    prices = dict(DEFAULT_PRICES_USD_PER_GPU_HOUR)
    if path is None:
        return prices
    p = Path(path)
    data = load_document(p, what="price table",
                         fmt="toml" if p.suffix.lower() == ".toml" else "json")
    if not isinstance(data, dict):
        raise InputFileError(str(p), "a price table is an object of GPU name -> USD per "
                             'GPU-hour, e.g. {"H100-SXM": 2.99}')
    for name, price in data.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) \
                or not math.isfinite(price) or price < 0:
            raise InputFileError(str(p), "a price must be a non-negative number of US "
                                 "dollars per GPU-hour", key=str(name))
        prices[_canonical_gpu(str(name))] = float(price)
    return prices


def _canonical_gpu(name: str) -> str:
    try:
        return resolve_gpu(name).name if not name.lower().endswith(".json") else name
    except Exception:  # a name the GPU table does not know: priced as written
        return name


def gpu_name(options: Mapping[str, Any]) -> str:
    """The table name of a point's GPU (the default GPU when it names none)."""
    gpu = options.get("gpu")
    if gpu is None:
        return DEFAULT_GPU
    try:
        return resolve_gpu(str(gpu)).name
    except Exception:  # the point's own run reports a bad GPU
        return str(gpu)


def build_row(*, index: int, labels: Mapping[str, str], options: Mapping[str, Any],
              metrics: Mapping[str, Any] | None, error: str | None, wall_s: float | None,
              cached: bool, prices: Mapping[str, float], slo: Slo) -> dict[str, Any]:
    """One output row: ``point``, the axis values as written, ``status``, the figures,
    ``gpu``, ``usd_per_hour``, ``usd_per_m_output_tokens``, ``meets_slo``, ``error``,
    ``cached`` and ``wall_s``."""
    row: dict[str, Any] = {"point": index, **labels,
                           "status": "ok" if error is None else "error"}
    m = metrics or {}
    for k in METRICS:
        row[k] = m.get(k)
    gpu = gpu_name(options)
    row["gpu_type"] = gpu
    price = prices.get(gpu)
    gpus = m.get("gpus")
    cost = price * gpus if price is not None and gpus is not None and error is None else None
    row["usd_per_hour"] = cost
    tps = m.get("output_tokens_per_s")
    row["usd_per_m_output_tokens"] = (cost / (tps * 3600) * 1e6
                                      if cost is not None and tps else None)
    row["meets_slo"] = error is None and slo.met(m)
    row["error"] = error
    row["cached"] = cached
    row["wall_s"] = wall_s
    return row


def comparable(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` without the columns that depend on where and when it ran."""
    return {k: v for k, v in row.items() if k not in EXCLUDED_FROM_COMPARISON}


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def write_rows(rows: Sequence[Mapping[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write ``rows.csv`` and ``rows.json`` (and ``rows.parquet`` when ``pyarrow`` is
    importable) under ``out_dir``; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    written = [out / "rows.csv", out / "rows.json"]
    with open(written[0], "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _csv_value(r.get(k)) for k in columns})
    written[1].write_text(json.dumps([dict(r) for r in rows], indent=1, allow_nan=False)
                          + "\n", encoding="utf-8")
    try:
        pa: Any = importlib.import_module("pyarrow")
        pq: Any = importlib.import_module("pyarrow.parquet")
    except ModuleNotFoundError:
        return written
    table = pa.table({k: [r.get(k) for r in rows] for k in columns})
    pq.write_table(table, out / "rows.parquet")
    written.append(out / "rows.parquet")
    return written
