"""The pure-Python core of this checkout against an earlier commit's, in CPU instructions
per core call: a comparison the load of a shared machine does not move.

``pure_core_speed.py`` compares wall-clock ops/s; on a shared 2-core machine one run of the
same code moves by tens of per cent. This script counts instructions instead, with
``valgrind --tool=cachegrind --cache-sim=no`` (valgrind must be installed). Each side runs
this file in a child process (``--child``) under ``PAGEDKV_PURE=1`` and
``PYTHONHASHSEED=0``, with only ``PYTHONPATH`` differing (the earlier commit's ``src``
exported with ``git archive``), garbage collection off while it measures; a call type's
cost is ``(instructions of a run making N calls - instructions of the same run's set-up
alone) / N``, so start-up and set-up (requests built, prompts hashed) cancel. Call
types, on one full-attention group (block 16, 4,096 blocks):

* ``decode``: ``append_output_tokens(token)`` then ``allocate_slots(request, 1)`` on one of
  50 running requests (a new block every 16th step, its hash and registration included);
* ``lookup``: ``get_computed_blocks`` of a new 1,000-token request (no hit);
* ``first_allocate_free``: that request's first ``allocate_slots`` (63 blocks taken from a
  pool full of cached blocks, so the take evicts, and registered) and its ``free``.

Printed: per call type, each side's instructions per call and the ratio earlier / this
(above 1: this checkout runs fewer instructions). Instructions are not time (memory stalls
and the garbage collector are not in them), but an instruction added to a call is one the
call runs on every machine::

    python benchmarks/pure_core_instructions.py --baseline ded63ff
    python benchmarks/pure_core_instructions.py --baseline ded63ff --calls 400
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from pure_core_speed import export_src  # noqa: E402

SRC = os.path.join(os.path.dirname(HERE), "src")
CALL_TYPES = ("decode", "lookup", "first_allocate_free")
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def child(call_type: str, num_calls: int, calls: bool) -> None:
    """Set up a manager for ``num_calls`` calls of ``call_type`` and, if ``calls``, make
    them (the measured part)."""
    from pagedkv import FullAttentionSpec, KVCacheManager, Request

    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
    mgr: Any = KVCacheManager.from_spec(spec, num_blocks=4096, max_model_len=8192,
                                        enable_caching=True)
    if call_type == "decode":
        running = []
        for i in range(50):
            req: Any = Request(f"d{i}", list(range(i * 1000, i * 1000 + 100)),
                               hasher=mgr.hasher)
            mgr.allocate_slots(req, req.num_tokens,
                               new_computed_blocks=mgr.get_computed_blocks(req))
            req.num_computed_tokens = req.num_tokens
            running.append(req)
        gc.disable()
        for step in range(num_calls if calls else 0):
            req = running[step % 50]
            req.append_output_tokens(7)
            mgr.allocate_slots(req, 1)
            req.num_computed_tokens += 1
        return
    # New 1,000-token requests; the pool is filled with cached blocks first (5 x 63 blocks
    # would not fill 4,096: 70 warm-up requests do), so every take evicts.
    prompts = [list(range(i * 3000, i * 3000 + 1000)) for i in range(70 + num_calls)]
    requests = [Request(f"n{i}", p, hasher=mgr.hasher) for i, p in enumerate(prompts)]
    for req in requests[:70]:
        mgr.allocate_slots(req, req.num_tokens, new_computed_blocks=mgr.get_computed_blocks(req))
        mgr.free(req)
    gc.disable()
    for req in requests[70:] if calls else ():
        if call_type == "lookup":
            mgr.get_computed_blocks(req)
        else:
            mgr.allocate_slots(req, req.num_tokens)
            mgr.free(req)


def instructions(src: str, call_type: str, num_calls: int, calls: bool) -> int:
    """Instructions of one child run set up for ``call_type`` x ``num_calls`` (making the
    calls if ``calls``) with ``src`` first on the path."""
    env = {**os.environ, "PAGEDKV_PURE": "1", "PYTHONHASHSEED": "0", "PYTHONPATH": src}
    proc = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, os.path.abspath(__file__), "--child", call_type, str(num_calls),
         str(int(calls))],
        capture_output=True, text=True, env=env, check=False, timeout=1800)
    found = _REFS.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"pure_core_instructions: the {call_type} run failed: {tail[0]}")
    return int(found.group(1).replace(",", ""))


def per_call(src: str, call_type: str, num_calls: int) -> float:
    """Instructions per call: a run making ``num_calls`` calls less its set-up alone."""
    return (instructions(src, call_type, num_calls, True)
            - instructions(src, call_type, num_calls, False)) / num_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="the earlier commit (e.g. ded63ff)")
    parser.add_argument("--calls", type=int, default=200,
                        help="calls per measured run (decode: x10); default 200")
    parser.add_argument("--child", nargs=3, metavar=("CALL_TYPE", "N", "CALLS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2] == "1")
        return
    if not args.baseline:
        raise SystemExit("pure_core_instructions: give --baseline COMMIT (e.g. ded63ff)")
    if args.calls <= 0:
        raise SystemExit("pure_core_instructions: --calls must be a positive count")
    if shutil.which("valgrind") is None:
        raise SystemExit("pure_core_instructions: valgrind is not installed "
                         "(Debian/Ubuntu: apt install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {args.baseline: export_src(args.baseline, tmp), "this": SRC}
        print(f"pure core, instructions per call (valgrind cachegrind), "
              f"this checkout vs {args.baseline}")
        print(f"{'call type':22s} {args.baseline:>14s} {'this':>14s}  earlier/this")
        for call_type in CALL_TYPES:
            n = args.calls * 10 if call_type == "decode" else args.calls
            before, after = (per_call(srcs[s], call_type, n) for s in (args.baseline, "this"))
            print(f"{call_type:22s} {before:14,.0f} {after:14,.0f}  {before / after:.3f}")


if __name__ == "__main__":
    main()
