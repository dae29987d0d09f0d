"""Simulated vs measured TPOT and output throughput across concurrency (the published
sweeps of pagedkv.sim.clock.validation) -> docs/img/clock_validation.png.

    PYTHONPATH=src python benchmarks/clock_validation_plot.py [OUT.png]
"""

from __future__ import annotations

import sys
from dataclasses import replace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pagedkv.sim.clock.validation import POINTS, simulate_run


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/img/clock_validation.png"
    a100 = next(p for p in POINTS if p.name.endswith("c=1 TPOT")).run
    rtx = {p.run.concurrency: p.measured for p in POINTS
           if p.metric == "output_tok_s" and "RTX" in p.name}
    rtx_run = next(p.run for p in POINTS if "RTX" in p.name)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    cs = [1, 2, 4, 8, 16, 32]
    sims = [simulate_run(replace(a100, concurrency=c, num_requests=20 * c)) for c in cs]
    ax1.plot(cs, [s["tpot_ms"] for s in sims], "o-", label="simulated TPOT (ms)")
    ax1.plot([1], [13.3], "s", color="C3", markersize=9, label="measured TPOT (ms)")
    thr1 = sims[0]["output_tok_s"]
    ax1b = ax1.twinx()
    ax1b.plot(cs, [s["output_tok_s"] / thr1 for s in sims], "^--", color="C2",
              label="simulated throughput / c=1")
    ax1b.plot([8], [6.6], "D", color="C1", markersize=9, label="measured throughput / c=1")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("concurrency")
    ax1.set_ylabel("TPOT (ms)")
    ax1b.set_ylabel("throughput relative to c=1")
    ax1.set_title("Llama-3.1-8B BF16, A100-40GB\n1024 in / 128 out", fontsize=10)
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax1b.get_legend_handles_labels()
    ax1.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    cs2 = sorted(rtx)
    sims2 = [simulate_run(replace(rtx_run, concurrency=c)) for c in cs2]
    ax2.plot(cs2, [s["output_tok_s"] for s in sims2], "o-", label="simulated output tokens/s")
    ax2.plot(cs2, [rtx[c] for c in cs2], "s", color="C3", markersize=8,
             label="measured output tokens/s")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("concurrency")
    ax2.set_ylabel("output tokens/s")
    ax2.set_title("Mistral-7B BF16, RTX 4090 (JSON spec)\n300 x 256 in / <= 128 out", fontsize=10)
    ax2b = ax2.twinx()
    ax2b.plot(cs2, [s["tpot_ms"] for s in sims2], "^--", color="C2", label="simulated TPOT")
    ax2b.set_ylabel("simulated TPOT (ms)")
    h1, l1 = ax2.get_legend_handles_labels()
    h2, l2 = ax2b.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    fig.suptitle("pagedkv roofline clock (zero-fit defaults) vs published vLLM measurements")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"written {out}")


if __name__ == "__main__":
    main()
