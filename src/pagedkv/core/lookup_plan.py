"""Which coordinators' lookups run as one kernel, and the plan the kernel reads
(:mod:`pagedkv.core.kernels_hybrid_hits`).

A coordinator gets a plan when every group that joins lookups finds its hits by its
class's own rule — full attention (MLA, sinks and the other subclasses that keep its
rule), sliding window, chunked local or Mamba align — with no group dropping its last hit
block (the EAGLE drop runs vLLM's own fixed point, :mod:`pagedkv.core.eagle_hits`).
Anything else (an overridden rule, a manager replaced by a test or a component) keeps
the coordinator's Python lookup. The plan is read once, at construction: the managers'
parameters do not change afterwards, and the index dicts are cleared in place, never
replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from pagedkv.core.kernels_hybrid_hits import KIND_CHUNK, KIND_PREFIX, KIND_STATE, KIND_WINDOW
from pagedkv.core.managers.base import SingleTypeManager
from pagedkv.core.managers.chunked_local import ChunkedLocalManager
from pagedkv.core.managers.full import FullAttentionManager
from pagedkv.core.managers.mamba import MambaAlignManager
from pagedkv.core.managers.sliding_window import SlidingWindowManager

__all__ = ["KernelLookup", "hit_plan"]


def _entry(m: SingleTypeManager) -> tuple[Any, ...] | None:
    """The kernel's entry for group ``m`` (kernels_hybrid_hits), or None when its lookup
    is not one the kernel covers. No state change."""
    if m.drop_last_hit or type(m).group_hashes is not SingleTypeManager.group_hashes:
        return None
    own = m.__dict__.get("find_longest_cache_hit")
    if own is not None and getattr(own, "__func__", None) is not (
            FullAttentionManager._hit_by_kernel):
        return None
    rule = type(m).find_longest_cache_hit
    a = b = 0
    if rule is FullAttentionManager.find_longest_cache_hit:
        kind = KIND_PREFIX
    elif rule is SlidingWindowManager.find_longest_cache_hit:
        kind, a = KIND_WINDOW, m.num_run_blocks  # type: ignore[attr-defined]
    elif rule is ChunkedLocalManager.find_longest_cache_hit:
        kind = KIND_CHUNK
        a, b = m.attention_chunk_size, m.chunk_blocks  # type: ignore[attr-defined]
    elif rule is MambaAlignManager.find_longest_cache_hit:
        kind, a = KIND_STATE, m.hit_alignment_tokens
    else:
        return None
    return (m.group, kind, m.pool.index[m.group], m.hash_stride, m.block_size, a, b)


def hit_plan(managers: Sequence[SingleTypeManager], full: Sequence[int],
             others: Sequence[int], lcm: int, unitary: bool) -> tuple[Any, ...] | None:
    """The plan of a coordinator over ``managers`` whose lookup asks ``full`` once and
    ``others`` in every pass (``unitary``: its one group, once), lengths rounded down to
    ``lcm``; None when a group's lookup is not covered (module docstring). Reads the
    managers only."""
    entries = []
    for g in (*full, *others):
        e = _entry(managers[g])
        if e is None or e[0] != g:
            return None
        entries.append(e)
    nfull = len(full)
    return (len(managers), lcm, unitary, tuple(entries[:nfull]), tuple(entries[nfull:]))


class KernelLookup:
    """A coordinator's lookup through the kernel where its plan allows it: the mixin of
    :class:`~pagedkv.core.coordinator_simple.UnitaryCoordinator` and
    :class:`~pagedkv.core.coordinator_hybrid.HybridCoordinator`. The coordinator decides
    its plan in ``_install_hit`` (called at construction and after copy and pickle) and
    passes it to :meth:`_use_hit_kernel`; ``_kernels`` is its kernel set."""

    _kernels: Any

    def _install_hit(self) -> None:
        """Decide the plan (the coordinator's own rule); here: no kernel."""

    def _use_hit_kernel(self, plan: tuple[Any, ...] | None) -> None:
        """With a plan, the kernel in front of ``find_longest_cache_hit`` and the façade's
        ``lookup_request`` over it (no reference back to the coordinator); without one,
        nothing changes."""
        if plan is not None:
            ks = self._kernels
            find = self.find_longest_cache_hit = ks.hybrid_hit(plan)
            self.lookup_request = partial(  # type: ignore[method-assign]
                ks.lookup_request, find)

    def lookup_request(self, mgr: Any, request: Any, num_tokens: int) -> Any:
        """The façade's lookup after its checks: ``find_longest_cache_hit``, counted and
        built as the hit (the kernel
        :func:`~pagedkv.core.kernels_hybrid_hits.lookup_request`; an instance whose lookup
        is a kernel holds the kernel over it instead). Mutates the lookup statistics."""
        return self._kernels.lookup_request(self.find_longest_cache_hit, mgr, request,
                                            num_tokens)

    def __getstate__(self) -> dict[str, Any]:
        """Copy and pickle state: the lookup kernel is built again, not copied."""
        state = dict(self.__dict__)
        state.pop("find_longest_cache_hit", None)
        state.pop("lookup_request", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._install_hit()
