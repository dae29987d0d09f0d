"""kv-cache-tester agentic sessions (real coding-agent sessions): one JSON document per
session::

    {"id": "trace_0001", "block_size": 64, "hash_id_scope": "local",
     "requests": [{"t": 0.0, "type": "n", "in": 71175, "out": 169, "hash_ids": [1, 2, ...]},
                  {"t": 134.2, "type": "subagent", "requests": [{"t": 0.0, ...}, ...]},
                  ...]}

``t`` is seconds from the session start; a sub-agent's requests carry times relative to the
sub-agent's own ``t`` (nested sub-agents nest the same way). ``t`` need not be monotone:
requests are sorted by their absolute time (stable). ``hash_ids`` name the *full*
``block_size``-token blocks of the prompt (``floor(in / block_size)`` ids; one more, for a
partial last block, is accepted), with prefix semantics. ``type`` is ``"n"``
(non-streaming), ``"s"`` (streaming) or ``"subagent"``; other keys are ignored. Ids of a
``"local"`` scope (the default) mean something only inside their file: replayed together
with other files, each file's ids are renamed apart (:func:`pagedkv.sim.loaders.load_trace`).

Worked case: a session with requests at t = 0 and 5 and a sub-agent at t = 2 whose requests
are at 0 and 1 replays at 0, 2, 3, 5.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pagedkv.errors import InputFileError
from pagedkv.json_input import parse_json
from pagedkv.sim.loaders.common import Skips, int_field, read_all_text, shift_requests
from pagedkv.sim.loaders.registry import TraceFormat, register_format
from pagedkv.sim.workloads import SimRequest, Workload

__all__ = ["DEFAULT_BLOCK_SIZE", "load_kv_cache_tester", "parse_session"]

#: Tokens per hash id when a file does not say.
DEFAULT_BLOCK_SIZE = 64
_MAX_DEPTH = 32


def load_kv_cache_tester(
    path: str | Path, *, skip_bad_lines: bool = False, limit: int | None = None
) -> Workload:
    """Load one session file (module docstring). ``skip_bad_lines`` skips and counts bad
    requests; ``limit`` keeps the first N requests by time.

    Raises:
        InputFileError: not JSON, not a session object, or a bad request (unless
            skipped); names the file and the JSON path of the request and key.
    """
    p = Path(path)
    text = read_all_text(p)
    doc = parse_json(text, str(p), hint="; expected one JSON document per session")
    return parse_session(doc, name=str(p), skip_bad_lines=skip_bad_lines, limit=limit)


def parse_session(
    doc: object, *, name: str, skip_bad_lines: bool = False, limit: int | None = None
) -> Workload:
    """The workload of a parsed session document ``doc`` (errors name ``name``)."""
    if isinstance(doc, list):
        raise InputFileError(
            name, "a JSON array; expected a kv-cache-tester session (one JSON object with a "
            "'requests' list) or Mooncake JSON lines (one object per line, no enclosing "
            "array: try converting it with `jq -c '.[]'`)")
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise InputFileError(
            name, "expected a kv-cache-tester session: a JSON object with a 'requests' list",
            key="requests",
        )
    bs = DEFAULT_BLOCK_SIZE
    if "block_size" in doc:
        bs = int_field(name, None, "block_size", doc["block_size"], minimum=1)
    scope = doc.get("hash_id_scope", "local")
    if scope not in ("local", "global"):
        raise InputFileError(name, f"must be 'local' or 'global', got {scope!r}",
                             key="hash_id_scope")
    sid = str(doc.get("id", Path(name).stem))
    skips = Skips(skip_bad_lines)
    reqs: list[SimRequest] = []
    _walk(doc["requests"], 0.0, "requests", name, sid, bs, skips, reqs, 0)
    if not reqs:
        raise InputFileError(name, "no valid request in the session", key="requests")
    reqs = shift_requests(reqs)
    if limit is not None:
        reqs = reqs[:limit]
    n_sub = sum(1 for r in reqs if "/sa" in r.request_id)
    return Workload(
        name=Path(name).name,
        requests=tuple(reqs),
        source_block_size=bs,
        num_skipped_lines=skips.count,
        first_skipped_problem=skips.first,
        description=f"kv-cache-tester session {sid}: {len(reqs)} requests"
        + (f" ({n_sub} in sub-agents)" if n_sub else ""),
        hash_ids_local=scope == "local",
    )


def _time(name: str, where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
        value
    ):
        raise InputFileError(name, f"must be a number of seconds, got {value!r}",
                             key=f"{where}.t")
    if value < 0:
        raise InputFileError(name, f"must be >= 0, got {value}", key=f"{where}.t")
    return float(value)


def _walk(
    items: list[Any], base_s: float, where: str, name: str, sid: str, bs: int, skips: Skips,
    out: list[SimRequest], depth: int,
) -> None:
    if depth > _MAX_DEPTH:
        raise InputFileError(name, f"sub-agents nested deeper than {_MAX_DEPTH}", key=where)
    for k, item in enumerate(items):
        at = f"{where}[{k}]"
        try:
            if not isinstance(item, dict):
                raise InputFileError(name, "a request must be a JSON object", key=at)
            if "t" not in item:
                raise InputFileError(name, "missing", key=f"{at}.t")
            t = base_s + _time(name, at, item["t"])
            if item.get("type") == "subagent":
                sub = item.get("requests")
                if not isinstance(sub, list):
                    raise InputFileError(name, "a sub-agent needs a 'requests' list",
                                         key=f"{at}.requests")
                _walk(sub, t, f"{at}.requests", name, f"{sid}/sa{k}", bs, skips, out,
                      depth + 1)
                continue
            out.append(_request(item, t, at, name, f"{sid}#{k}", bs, len(out)))
        except InputFileError as exc:
            skips.bad(exc)


def _request(item: dict[str, Any], t: float, at: str, name: str, rid: str, bs: int,
             uniq: int) -> SimRequest:
    for key in ("in", "out", "hash_ids"):
        if key not in item:
            raise InputFileError(name, "missing", key=f"{at}.{key}")
    num_in = int_field(name, None, f"{at}.in", item["in"], minimum=1)
    num_out = int_field(name, None, f"{at}.out", item["out"], minimum=0)
    ids = item["hash_ids"]
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 1 << 63 for h in ids
    ):
        raise InputFileError(name, "must be a list of non-negative integers",
                             key=f"{at}.hash_ids")
    full = num_in // bs
    if len(ids) not in (full, -(-num_in // bs)):
        raise InputFileError(
            name, f"has {len(ids)} ids but in={num_in} has floor({num_in}/{bs}) = {full} "
            f"full {bs}-token blocks", key=f"{at}.hash_ids",
        )
    if len(ids) < -(-num_in // bs):
        # The partial last block has no id: give it one no other prompt of the file has
        # (its content is unknown), so the ids cover ceil(in/bs) blocks as in Mooncake.
        ids = [*ids, (1 << 63) + uniq]
    return SimRequest(
        request_id=rid, arrival_s=t, num_prompt_tokens=num_in, num_output_tokens=num_out,
        hash_ids=tuple(ids),
    )


def _sniff(head: str) -> bool:
    start = head.lstrip()[:2048]
    return start.startswith("{") and '"requests"' in start and '"timestamp"' not in start


register_format(TraceFormat(
    name="kv-cache-tester",
    expects="one JSON document per session: {\"block_size\", \"requests\": [{\"t\", "
            "\"in\", \"out\", \"hash_ids\"} or sub-agents]}",
    extensions=(".json",),
    sniff=_sniff,
    load=lambda path, o: load_kv_cache_tester(
        path, skip_bad_lines=o.skip_bad_lines, limit=o.limit),
))
