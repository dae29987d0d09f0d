"""``pagedkv check-attention``: prefix caching on versus off through real tensors.

Importing this module needs no PyTorch (so ``pagedkv --help`` works without it); running
the command without it fails with one line naming the extra to install.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from pagedkv.errors import InvalidArgumentError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check-attention",
        help="check that prefix caching changes no logit (needs the torch extra)",
        description="Run a tiny random decoder through KVCacheManager twice per layout "
        "(full; full+sliding; full+chunked; full+mamba; mla): with prefix caching and "
        "shuffled block placement, and without caching. Freed blocks are poisoned with NaN. "
        "Prints per layout the hit tokens, preemptions, evicted blocks, the largest "
        "|logit difference| and whether the logits are bitwise equal; exits 1 on any "
        "mismatch.",
    )
    p.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:N")
    p.add_argument("--layout", action="append", metavar="NAME",
                   help="check only this layout (repeatable); default all")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="CPU threads for torch (default 1: results do not depend on it, "
                   "and one thread is fastest for these tiny tensors)")
    p.add_argument("--seed", type=int, default=1, help="seed of the shuffled placement")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pagedkv.torch._deps import torch
    from pagedkv.torch.check import LAYOUTS, check_layout, layout_named

    if args.threads < 1:
        raise InvalidArgumentError(f"--threads must be >= 1, got {args.threads}")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise InvalidArgumentError(
            f"unknown device {args.device!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgumentError("CUDA is not available on this machine; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"unsupported device {args.device!r}; use cpu or cuda")
    torch.set_num_threads(args.threads)
    layouts = [layout_named(n) for n in args.layout] if args.layout else list(LAYOUTS)
    rows = []
    start = time.perf_counter()
    for layout in layouts:
        t0 = time.perf_counter()
        result = check_layout(layout, device=device, seed=args.seed)
        rows.append((result, time.perf_counter() - t0))
    elapsed = time.perf_counter() - start
    ok = all(r.ok for r, _ in rows)
    if args.json:
        print(json.dumps({
            "device": str(device), "torch": torch.__version__, "ok": ok,
            "seconds": round(elapsed, 3),
            "layouts": [{**_as_dict(r), "ok": r.ok, "seconds": round(s, 3)} for r, s in rows],
        }, indent=2))
    else:
        _print_table(rows, str(device), torch.__version__, elapsed)
    if not ok:
        bad = [r.layout for r, _ in rows if not r.ok]
        print(f"pagedkv check-attention: error: mismatch in {', '.join(bad)} (cached and "
              "uncached logits differ, no prefix hit, or the null block was written)",
              file=sys.stderr)
        return 1
    return 0


def _as_dict(result: Any) -> dict[str, Any]:
    fields = ("layout", "hit_tokens", "computed_tokens_cached", "computed_tokens_uncached",
              "preemptions", "evicted_blocks", "compared_positions", "max_abs_diff",
              "bitwise_equal", "null_block_untouched")
    out = {f: getattr(result, f) for f in fields}
    if out["max_abs_diff"] == float("inf"):
        out["max_abs_diff"] = None  # JSON has no infinity; None = NaN or missing position
    return out


def _print_table(rows: list[tuple[Any, float]], device: str, version: str,
                 elapsed: float) -> None:
    header = ("layout", "hit tokens", "preempt", "evicted", "positions", "max |Δ logits|",
              "bitwise equal", "seconds")
    lines = [header] + [
        (r.layout, str(r.hit_tokens), str(r.preemptions), str(r.evicted_blocks),
         str(r.compared_positions), f"{r.max_abs_diff:.3g}",
         "yes" if r.bitwise_equal else "NO", f"{s:.1f}")
        for r, s in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print(f"check-attention on {device} (torch {version}): cached + shuffled placement vs "
          "uncached, NaN-poisoned fresh blocks")
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    verdict = "all layouts bitwise equal" if all(r.ok for r, _ in rows) else "MISMATCH"
    print(f"{verdict} ({elapsed:.1f} s)")
