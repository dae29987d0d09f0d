"""KV-cache layouts the suite drives, described once and built on both sides.

A layout is a tuple of groups; each group is one attention kind with its block size and
window / chunk. ``lcm`` and ``gcd`` of the block sizes give the scheduler block size and the
hash block size, as vLLM's ``resolve_kv_cache_block_sizes`` derives them with prefix
caching on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LAYOUTS", "GroupDesc", "Layout", "layout_by_name", "layouts_for", "release_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupDesc:
    """One KV-cache group: ``kind`` is full / mla / swa / chunked / mamba / swamla
    (DeepSeek-V4's sliding-window MLA with bounded prefix replay)."""

    kind: str
    block_size: int
    window_tokens: int = 0  # sliding window (swa, swamla) or attention chunk (chunked)


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """A named model layout and the pool it runs on."""

    name: str
    groups: tuple[GroupDesc, ...]
    num_blocks: int
    max_model_len: int = 512
    prefix_match_unit: int | None = None  # vLLM's cache_config.prefix_match_unit
    num_hash_lookahead_tokens: int = 0  # tokens after each block its hash covers
    num_prefill_lookahead_tokens: int = 0  # a drafter's prefill lookahead (MTP: k tokens)
    use_eagle: bool = False  # the EAGLE last-block drop (vLLM's use_eagle)
    connector: bool = False  # a KV connector's calls: per-group hits, boundary offloads
    external_loads: bool = False  # a connector's loads of external tokens at admission

    @property
    def scheduler_block_size(self) -> int:
        return math.lcm(*(g.block_size for g in self.groups))

    @property
    def replay_tokens(self) -> int:
        """Tokens of a hit the scheduler recomputes (vLLM's ``prefix_replay_tokens``):
        the window of a swamla group, else 0."""
        return max((g.window_tokens for g in self.groups if g.kind == "swamla"), default=0)

    @property
    def hash_block_size(self) -> int:
        if self.prefix_match_unit is not None:
            return self.prefix_match_unit
        return math.gcd(*(g.block_size for g in self.groups))


def _g(kind: str, block_size: int, window_tokens: int = 0) -> GroupDesc:
    return GroupDesc(kind=kind, block_size=block_size, window_tokens=window_tokens)


LAYOUTS: tuple[Layout, ...] = (
    Layout(name="full-4", groups=(_g("full", 4),), num_blocks=64),
    Layout(name="full-16", groups=(_g("full", 16),), num_blocks=40),
    Layout(name="mla-16", groups=(_g("mla", 16),), num_blocks=40),
    Layout(name="swa", groups=(_g("swa", 8, 24),), num_blocks=48),
    Layout(name="chunked", groups=(_g("chunked", 8, 32),), num_blocks=48),
    Layout(name="full+swa", groups=(_g("full", 8), _g("swa", 8, 24)), num_blocks=96),
    Layout(name="full+chunked", groups=(_g("full", 8), _g("chunked", 8, 32)), num_blocks=96),
    Layout(name="full+mamba", groups=(_g("full", 16), _g("mamba", 16)), num_blocks=64),
    Layout(
        name="full+swa+mamba",
        groups=(_g("full", 16), _g("swa", 16, 32), _g("mamba", 16)),
        num_blocks=96,
    ),
    Layout(name="full32+swa16", groups=(_g("full", 32), _g("swa", 16, 40)), num_blocks=80),
    Layout(name="full32+swa8", groups=(_g("full", 32), _g("swa", 8, 8)), num_blocks=120),
    Layout(
        name="full+mamba/unit4",
        groups=(_g("full", 16), _g("mamba", 16)),
        num_blocks=64,
        prefix_match_unit=4,
    ),
    Layout(name="full-16/la1", groups=(_g("full", 16),), num_blocks=40,
           num_hash_lookahead_tokens=1),
    Layout(name="full-16/la4", groups=(_g("full", 16),), num_blocks=40,
           num_hash_lookahead_tokens=4),
    Layout(name="full+mamba/la1", groups=(_g("full", 16), _g("mamba", 16)), num_blocks=64,
           num_hash_lookahead_tokens=1),
    Layout(name="full+mamba/la4", groups=(_g("full", 16), _g("mamba", 16)), num_blocks=64,
           num_hash_lookahead_tokens=4),
    Layout(name="full32+swa16/la2", groups=(_g("full", 32), _g("swa", 16, 40)), num_blocks=80,
           num_hash_lookahead_tokens=2),
    Layout(name="full+mamba/unit4/la4", groups=(_g("full", 16), _g("mamba", 16)),
           num_blocks=64, prefix_match_unit=4, num_hash_lookahead_tokens=4),
    # DeepSeek-V4-style: a bounded-replay SWA-MLA group beside full attention / MLA (the
    # workload replays each hit's last window, see conformance/replay.py).
    Layout(name="full+swamla", groups=(_g("full", 16), _g("swamla", 16, 32)), num_blocks=96),
    Layout(name="mla+swamla", groups=(_g("mla", 8), _g("swamla", 8, 20)), num_blocks=120),
    # Multi-module MTP with 3 speculative tokens: lookahead hashes, no EAGLE drop (vLLM's
    # scheduler without a connector), the last 2 computed tokens never registered.
    Layout(name="full-16/mtp3", groups=(_g("full", 16),), num_blocks=40,
           num_hash_lookahead_tokens=3, num_prefill_lookahead_tokens=3),
    Layout(name="full+mamba/mtp3", groups=(_g("full", 16), _g("mamba", 16)), num_blocks=64,
           num_hash_lookahead_tokens=3, num_prefill_lookahead_tokens=3),
    # MTP behind a connector (no lookahead hashes: the EAGLE drop instead).
    Layout(name="full-16/eagle-mtp3", groups=(_g("full", 16),), num_blocks=40,
           num_prefill_lookahead_tokens=3, use_eagle=True),
    # A KV connector on a Mamba hybrid: per-group hits, evictions,
    # boundary-state offloads (with sub-block producer tails under unit4).
    Layout(name="full+mamba/conn", groups=(_g("full", 16), _g("mamba", 16)), num_blocks=64,
           connector=True),
    Layout(name="full+mamba/unit4/conn", groups=(_g("full", 16), _g("mamba", 16)),
           num_blocks=64, prefix_match_unit=4, connector=True),
    # A connector's loads of external tokens at admission (sync, or async with delayed
    # caching and groups left unzeroed): every group's external blocks come before any
    # group's new ones (conformance/external.py).
    Layout(name="full-16/ext", groups=(_g("full", 16),), num_blocks=40, external_loads=True),
    Layout(name="full+swa/ext", groups=(_g("full", 8), _g("swa", 8, 24)), num_blocks=96,
           external_loads=True),
    Layout(name="full+mamba/ext", groups=(_g("full", 16), _g("mamba", 16)), num_blocks=64,
           external_loads=True),
    Layout(name="full+swa+mamba/ext",
           groups=(_g("full", 16), _g("swa", 16, 32), _g("mamba", 16)), num_blocks=96,
           external_loads=True),
    Layout(name="full+mamba/unit4/ext", groups=(_g("full", 16), _g("mamba", 16)),
           num_blocks=64, prefix_match_unit=4, external_loads=True),
    # The EAGLE last-block drop (a drafter without lookahead hashes, e.g. behind a
    # connector) on layouts of several groups: every group drops (mixed block sizes are
    # refused inside vLLM, pagedkv.vllm.layout.eagle_layout_problem).
    Layout(name="full+swa/eagle", groups=(_g("full", 8), _g("swa", 8, 24)), num_blocks=96,
           use_eagle=True),
    Layout(name="full+mamba/eagle", groups=(_g("full", 16), _g("mamba", 16)), num_blocks=64,
           use_eagle=True),
    Layout(name="full+swa+mamba/eagle",
           groups=(_g("full", 16), _g("swa", 16, 32), _g("mamba", 16)), num_blocks=96,
           use_eagle=True),
)


def layout_by_name(name: str) -> Layout:
    """The layout called ``name``; ``KeyError`` lists the known names."""
    for layout in LAYOUTS:
        if layout.name == name:
            return layout
    raise KeyError(f"unknown layout {name!r}; known: {', '.join(x.name for x in LAYOUTS)}")


def release_of(version: str) -> str:
    """The vLLM release series of a version string (``"vLLM 0.32.0"`` -> ``"0.32"``)."""
    number = version.split()[-1] if version.split() else version
    return ".".join(number.split(".")[:2])


def layouts_for(release: str, layouts: tuple[Layout, ...] = LAYOUTS) -> tuple[Layout, ...]:
    """The layouts vLLM ``release`` can run: hash lookahead is 0.33's (vLLM 0.32 has none)."""
    if release == "0.32":
        return tuple(x for x in layouts if not x.num_hash_lookahead_tokens)
    return layouts
