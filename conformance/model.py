"""Values both sides share: a request description and a comparable state snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FIELDS", "ReqDesc", "Snapshot"]

#: Compared fields, in the order a difference is reported.
FIELDS = ("num_free", "usage", "stats", "tables", "cached", "free_order", "events")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReqDesc:
    """A request as both sides build it.

    ``lora`` is ``(name, adapter_id, path)``; ``mm`` holds ``(identifier, offset, length)``
    items sorted by offset; ``salt`` may be ``""`` (vLLM: no salt).
    """

    request_id: str
    prompt: tuple[int, ...]
    lora: tuple[str, int, str] | None = None
    mm: tuple[tuple[str, int, int], ...] = ()
    salt: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Everything compared after an operation (events: the encoded payload bytes)."""

    num_free: int
    usage: float
    stats: tuple[int, ...]
    free_order: tuple[int, ...]
    cached: dict[int, tuple[int, bytes]] = field(default_factory=dict)
    tables: dict[str, tuple[list[int], ...]] = field(default_factory=dict)
    events: bytes = b""

    def diff(self, other: Snapshot, ignore: frozenset[str] = frozenset()) -> str | None:
        """The first field that differs, with both values; None when equal."""
        for name in FIELDS:
            if name in ignore:
                continue
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                if name == "cached":
                    keys = sorted(set(a) ^ set(b) | {k for k in set(a) & set(b) if a[k] != b[k]})
                    k = keys[0]
                    return (
                        f"cached[block {k}]: vllm={_short(a.get(k))} "
                        f"pagedkv={_short(b.get(k))} ({len(keys)} blocks differ)"
                    )
                if name == "tables":
                    keys = sorted(set(a) | set(b))
                    k = next(k for k in keys if a.get(k) != b.get(k))
                    return f"tables[{k}]: vllm={a.get(k)} pagedkv={b.get(k)}"
                if name == "events":
                    return "events: " + _event_diff(a, b)
                return f"{name}: vllm={a} pagedkv={b}"
        return None


def _short(value: tuple[int, bytes] | None) -> str:
    if value is None:
        return "uncached"
    return f"(group {value[0]}, {value[1][:6].hex()})"


def _event_diff(a: bytes, b: bytes) -> str:
    """The first differing event of two encoded batches, decoded, else both payloads' hex."""
    try:
        import msgpack

        ea = msgpack.unpackb(a)[1] if a else []
        eb = msgpack.unpackb(b)[1] if b else []
    except Exception:  # undecodable: show the bytes
        return f"vllm={a.hex()} pagedkv={b.hex()}"
    for k in range(max(len(ea), len(eb))):
        xa = ea[k] if k < len(ea) else None
        xb = eb[k] if k < len(eb) else None
        if xa != xb:
            if isinstance(xa, dict) and isinstance(xb, dict):
                keys = [f for f in {**xa, **xb} if xa.get(f, "<absent>") != xb.get(f, "<absent>")]
                parts = [
                    f"{f}: vllm={xa.get(f, '<absent>')!r} pagedkv={xb.get(f, '<absent>')!r}"
                    for f in keys
                ]
                return f"event {k} ({xa.get('type')}): " + "; ".join(parts)
            return f"event {k}: vllm={xa!r} pagedkv={xb!r}"
    return f"same events, different bytes: vllm={a.hex()} pagedkv={b.hex()}"
