"""What a vLLM request asks of pagedkv, in ``SamplingParams.extra_args["pagedkv"]``.

``{"retention": {...}}``: how long the request's blocks stay cached once it finishes,
TensorRT-LLM style (:class:`~pagedkv.retention.RequestRetention`; effective when the
scheduler's manager has retention on, see :mod:`pagedkv.vllm.scheduler`)::

    SamplingParams(max_tokens=64, extra_args={"pagedkv": {"retention": {
        "ranges": [{"start": 0, "end": 1024, "priority": 90, "duration_s": 600}],
        "decode_priority": 10}}})

Keys: ``ranges`` (each ``start``, ``end`` (optional), ``priority`` 0-100,
``duration_s`` (optional)), ``decode_priority``, ``decode_duration_s``,
``default_priority``.

``{"pin": {"ttl_s": 600, "num_tokens": 1024, "refresh_on_hit": false}}``: pin the
request's prompt prefix (its first ``num_tokens`` tokens, default the whole prompt) for
``ttl_s`` seconds once it is admitted (:meth:`pagedkv.retention.RetentionControl.pin_prefix`;
the pin budget applies, a pin past it is logged and dropped).

A malformed entry is logged once per request and ignored (the request runs without it): a
bad client field never stops the engine.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from pagedkv.arg_types import MAX_SECONDS
from pagedkv.errors import PagedKVError
from pagedkv.retention import RequestRetention, TokenRangeRetention

__all__ = ["PinAsk", "parse_pin", "parse_retention", "pin_of", "retention_of"]

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
    asked_ranges = value.get("ranges", [])
    if not isinstance(asked_ranges, list):
        raise InvalidArgumentError(
            f"pagedkv retention ranges must be a list of {{start, end, priority, duration_s}}"
            f", got {asked_ranges!r:.60}")
    for r in asked_ranges:
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


@dataclass(frozen=True)
class PinAsk:
    """A request's ask to pin its prompt prefix: ``ttl_s`` seconds, the first
    ``num_tokens`` tokens (None: the whole prompt)."""

    ttl_s: float
    num_tokens: int | None = None
    refresh_on_hit: bool = False


def parse_pin(value: Any) -> PinAsk:
    """The :class:`PinAsk` a request's ``"pin"`` entry describes.

    >>> parse_pin({"ttl_s": 60, "num_tokens": 512})
    PinAsk(ttl_s=60.0, num_tokens=512, refresh_on_hit=False)

    Raises:
        InvalidArgumentError: not a mapping, an unknown key, a ``ttl_s`` that is not a
            positive finite number, a negative ``num_tokens``.
    """
    from pagedkv.errors import InvalidArgumentError

    if not isinstance(value, dict) or set(value) - {"ttl_s", "num_tokens", "refresh_on_hit"}:
        raise InvalidArgumentError(
            f"a pagedkv pin is {{ttl_s, num_tokens, refresh_on_hit}}, got {value!r}")
    ttl = value.get("ttl_s")
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not (
            math.isfinite(ttl) and 0 < ttl <= MAX_SECONDS):
        raise InvalidArgumentError(f"pin ttl_s must be a positive number of seconds up to "
                                   f"1e9, got {ttl!r}")
    n = value.get("num_tokens")
    if n is not None and (type(n) is not int or n < 0):
        raise InvalidArgumentError(f"pin num_tokens must be an int >= 0, got {n!r}")
    refresh = value.get("refresh_on_hit", False)
    if type(refresh) is not bool:
        raise InvalidArgumentError(f"pin refresh_on_hit must be a bool, got {refresh!r}")
    return PinAsk(float(ttl), n, refresh)


def pin_of(request: Any) -> PinAsk | None:
    """The pin a vLLM request asks for, or None (none asked, or malformed: logged)."""
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None) if params is not None else None
    if not extra or "pagedkv" not in extra:
        return None
    asked = extra["pagedkv"]
    if not isinstance(asked, dict) or "pin" not in asked:
        return None
    try:
        return parse_pin(asked["pin"])
    except PagedKVError as e:
        _log.warning("request %s: pagedkv pin ignored: %s", request.request_id, e)
        return None
