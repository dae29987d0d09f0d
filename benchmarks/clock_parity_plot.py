"""Every published point of pagedkv.sim.clock.validation, simulated vs measured, with the
zero-fit constants and with each setup's constants fitted by --calibrate to its own
TTFT/TPOT points -> docs/img/clock_parity.png (and the table on stdout). About 3 minutes:
the fits replay every run many times.

    PYTHONPATH=src python benchmarks/clock_parity_plot.py [OUT.png]
"""

from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from pagedkv.sim.clock.validation import (
    POINTS,
    calibrated_constants,
    setup_key,
    simulate_point,
)

_UNITS = {"tpot_ms": "TPOT", "ttft_ms": "TTFT", "output_tok_s": "tokens/s", "ratio": "ratio"}


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/img/clock_parity.png"
    fitted = calibrated_constants()
    rows = []
    for p in POINTS:
        cal = fitted.get(setup_key(p.run))
        zero = simulate_point(p)
        after = simulate_point(p, cal) if cal is not None else zero
        rows.append((p, zero / p.measured, after / p.measured))
        print(f"{p.name:70s} {p.measured:10.4g} {zero:10.4g} "
              f"{100 * (zero / p.measured - 1):+7.1f} % {after:10.4g} "
              f"{100 * (after / p.measured - 1):+7.1f} %")
    fig, ax = plt.subplots(figsize=(11.5, 6.5))
    ys = range(len(rows))
    ax.axvspan(0.8, 1.2, color="0.92", label="±20 %")
    ax.axvline(1.0, color="0.4", linewidth=1)
    ax.plot([r[1] for r in rows], ys, "o", color="C3", label="zero-fit defaults")
    ax.plot([r[2] for r in rows], ys, "x", color="C0", markersize=9, mew=2,
            label="calibrated on the setup's own TTFT/TPOT points")
    for y, (_, a, b) in zip(ys, rows, strict=True):
        ax.plot([a, b], [y, y], color="0.6", linewidth=0.8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([f"{p.name}  [{_UNITS[p.metric]}]" for p, _, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xticks([0.1, 0.2, 0.5, 0.8, 1, 1.25, 2])
    ax.set_xticklabels(["0.1", "0.2", "0.5", "0.8", "1", "1.25", "2"])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("simulated / measured (log scale; 1 = exact)")
    ax.set_title("pagedkv roofline clock vs 18 published vLLM measurements")
    ax.legend(fontsize=8, loc="lower left")
    fig.subplots_adjust(left=0.36, right=0.98, top=0.94, bottom=0.09)
    fig.savefig(out, dpi=110)
    print(f"written {out}")


if __name__ == "__main__":
    main()
