"""Golden values computed by vLLM's own classes, frozen as a JSON file for vLLM-free tests.

Regenerate (from the repository root, with an interpreter that has vLLM)::

    python -m conformance.golden --vllm-python VLLM_PY --out tests/conformance/golden_vllm.json

Contents: block-hash vectors (plain, LoRA with a path, empty salt, a real salt, a multimodal
block, hash lookahead L = 1 and 3) from vLLM's request block hasher, and the msgpack
payload bytes of the event batch vLLM's manager emits (``KVEventBatch(ts=0.0, events,
data_parallel_rank=0)``) after admitting LoRA / multimodal / salted requests on one- and
two-group layouts, with and without hash lookahead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from conformance.layouts import GroupDesc, Layout
from conformance.model import ReqDesc

_TOKENS = [101, 7, 300, 65535, 65536, 2, 19, 44, 1000, 5, 6, 8, 70000, 23, 24, 25, 9, 10]

HASH_CASES: list[dict[str, Any]] = [
    {"name": "plain", "block_size": 4},
    {"name": "lora_with_path", "block_size": 4, "lora": ["ad1", 1, "/adapters/ad1"]},
    {"name": "lora_repointed", "block_size": 4, "lora": ["ad1", 1, "/adapters/ad1-v2"]},
    {"name": "empty_salt", "block_size": 4, "salt": ""},
    {"name": "salt", "block_size": 4, "salt": "tenant-1"},
    {"name": "mm_block", "block_size": 4, "mm": [["img-abc", 5, 6]]},
    {
        "name": "lora_mm_salt",
        "block_size": 8,
        "lora": ["ad2", 2, "/a/2"],
        "salt": "s",
        "mm": [["img-a", 1, 2], ["img-b", 9, 4]],
    },
    {"name": "lookahead_1", "block_size": 4, "lookahead": 1},
    {
        "name": "lookahead_3_lora_mm_salt",
        "block_size": 4,
        "lookahead": 3,
        "lora": ["ad1", 1, "/adapters/ad1"],
        "salt": "s",
        "mm": [["img-abc", 5, 2]],
    },
]

EVENT_CASES: list[dict[str, Any]] = [
    {
        "name": "lora_stored",
        "groups": [["full", 4, 0]],
        "requests": [{"lora": ["ad1", 3, "/adapters/ad1"]}],
    },
    {
        "name": "mm_stored",
        "groups": [["full", 4, 0]],
        "requests": [{"mm": [["img-abc", 2, 5], ["img-def", 9, 3]]}],
    },
    {
        "name": "salt_stored",
        "groups": [["full", 4, 0]],
        "requests": [{"salt": "tenant-1"}, {"salt": ""}],
    },
    {
        "name": "hybrid_stored",
        "groups": [["full", 4, 0], ["swa", 4, 8]],
        "requests": [{"lora": ["ad1", 3, "/p"], "salt": "s", "mm": [["img-abc", 6, 3]]}],
    },
    {
        "name": "lookahead_stored",
        "groups": [["full", 4, 0]],
        "lookahead": 2,
        "requests": [{"lora": ["ad1", 3, "/p"], "mm": [["img-abc", 4, 3]]}, {}],
    },
    {
        "name": "lookahead_hybrid_stored",
        "groups": [["full", 8, 0], ["swa", 4, 8]],
        "lookahead": 3,
        "requests": [{"salt": "s", "mm": [["img-abc", 8, 2]]}],
    },
]


def _desc(i: int, spec: dict[str, Any]) -> ReqDesc:
    lora = spec.get("lora")
    return ReqDesc(
        request_id=f"g{i}",
        prompt=tuple(spec.get("tokens", _TOKENS)),
        lora=None if lora is None else (lora[0], lora[1], lora[2]),
        mm=tuple((m[0], m[1], m[2]) for m in spec.get("mm", [])),
        salt=spec.get("salt"),
    )


def _layout(groups: list[list[Any]], lookahead: int = 0) -> Layout:
    return Layout(
        name="golden",
        groups=tuple(GroupDesc(kind=k, block_size=b, window_tokens=w) for k, b, w in groups),
        num_blocks=64,
        num_hash_lookahead_tokens=lookahead,
    )


def generate() -> dict[str, Any]:
    """Every golden value, computed with vLLM (must be importable)."""
    import vllm

    from conformance.vllm_side import VllmSide

    out: dict[str, Any] = {
        "vllm_version": vllm.__version__,
        "tokens": _TOKENS,
        "hashes": [],
        "stored_events": [],
    }
    for case in HASH_CASES:
        side = VllmSide(_layout([["full", case["block_size"], 0]], case.get("lookahead", 0)))
        side.new_request(_desc(0, case))
        out["hashes"].append({**case, "hashes": [h.hex() for h in side.block_hashes("g0")]})
    for case in EVENT_CASES:
        side = VllmSide(_layout(case["groups"], case.get("lookahead", 0)))
        for i, spec in enumerate(case["requests"]):
            d = _desc(i, spec)
            side.new_request(d)
            side.lookup(d.request_id)
            side.allocate(d.request_id, len(d.prompt), 0, True)
            side.commit(d.request_id, len(d.prompt))
        out["stored_events"].append({**case, "payload": side.snapshot().events.hex()})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m conformance.golden",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--vllm-python", help="interpreter with vLLM (re-runs this under it)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    if args.vllm_python:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (here, os.path.join(here, "src"), env.get("PYTHONPATH")) if p
        )
        return subprocess.call(
            [args.vllm_python, "-m", "conformance.golden", "--out", os.path.abspath(args.out)],
            env=env,
            cwd=here,
        )
    try:
        data = generate()
    except ImportError as exc:
        print(
            f"conformance.golden: vLLM is not importable here ({exc}); pass --vllm-python PATH",
            file=sys.stderr,
        )
        return 2
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    print(
        f"wrote {args.out}: {len(data['hashes'])} hash vectors, "
        f"{len(data['stored_events'])} event payloads (vLLM {data['vllm_version']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
