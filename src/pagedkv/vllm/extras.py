"""What a vLLM request asks of pagedkv, in ``SamplingParams.extra_args["pagedkv"]``.

``{"retention": {...}}``: how long the request's blocks stay cached once it finishes,
TensorRT-LLM style (:class:`~pagedkv.retention.RequestRetention`; effective when the
scheduler's manager has retention on, see :mod:`pagedkv.vllm.scheduler`)::

    SamplingParams(max_tokens=64, extra_args={"pagedkv": {"retention": {
        "ranges": [{"start": 0, "end": 1024, "priority": 90, "duration_s": 600}],
        "decode_priority": 10}}})

Keys: ``ranges`` (each ``start``, ``end`` (optional), ``priority`` 0-100,
``duration_s`` (optional)), ``decode_priority``, ``decode_duration_s``,
``default_priority``. A malformed entry is logged once per request and ignored (the
request runs with default retention): a bad client field never stops the engine.
"""

from __future__ import annotations

import logging
from typing import Any

from pagedkv.errors import PagedKVError
from pagedkv.retention import RequestRetention, TokenRangeRetention

__all__ = ["parse_retention", "retention_of"]

_log = logging.getLogger("pagedkv.vllm")


def parse_retention(value: Any) -> RequestRetention:
    """The :class:`RequestRetention` a request's ``"retention"`` entry describes.

    >>> r = parse_retention({"ranges": [{"start": 0, "end": 64, "priority": 90}]})
    >>> r.ranges[0].priority, r.ranges[0].token_end
    (90, 64)

    Raises:
        InvalidArgumentError: not a mapping, an unknown key, or a value out of range.
    """
    from pagedkv.errors import InvalidArgumentError

    if not isinstance(value, dict):
        raise InvalidArgumentError(f"pagedkv retention must be a mapping, got {value!r}")
    known = {"ranges", "decode_priority", "decode_duration_s", "default_priority"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise InvalidArgumentError(f"unknown pagedkv retention keys {unknown}; use {sorted(known)}")
    ranges = []
    for r in value.get("ranges", ()):
        if not isinstance(r, dict) or set(r) - {"start", "end", "priority", "duration_s"}:
            raise InvalidArgumentError(
                f"a retention range is {{start, end, priority, duration_s}}, got {r!r}")
        ranges.append(TokenRangeRetention(
            token_start=r.get("start", 0), token_end=r.get("end"),
            priority=r.get("priority", 35), duration_s=r.get("duration_s")))
    kwargs = {k: value[k] for k in ("decode_priority", "decode_duration_s",
                                    "default_priority") if k in value}
    return RequestRetention(ranges=tuple(ranges), **kwargs)


def retention_of(request: Any) -> RequestRetention | None:
    """The retention a vLLM request asks for, or None (none asked, or malformed: logged)."""
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None) if params is not None else None
    if not extra or "pagedkv" not in extra:
        return None
    asked = extra["pagedkv"]
    if not isinstance(asked, dict) or "retention" not in asked:
        return None
    try:
        return parse_retention(asked["retention"])
    except PagedKVError as e:
        _log.warning("request %s: pagedkv retention ignored: %s", request.request_id, e)
        return None
