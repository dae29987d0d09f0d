"""The KV cache a :class:`~pagedkv.planner.KVCachePlan` describes, as device tensors.

One flat byte tensor per planned tensor (``plan.tensors``); a layer's cache is a typed view
of the tensor it lives in, so layers that the plan makes share a tensor (layer *i* of every
group) share its memory, each group using its own blocks of it. Views per layer kind:

* attention (full, sliding, chunked, sinks, cross): ``[num_blocks, 2, block_size,
  num_kv_heads, head_size]`` (index 0 of dim 1 is K, 1 is V);
* MLA: one latent per token, ``[num_blocks, block_size, head_size]``;
* Mamba / linear-recurrent state: ``[num_blocks, state_bytes // itemsize]``, the first
  ``state_bytes`` of each (padded) page; the model reshapes it to its state shapes.

Worked case: two layers ``full.0`` (full attention) and ``mamba.0`` (state of 128 bytes),
block size 8, 2 KV heads of size 8, float32: the attention page is 2 x 8 x 2 x 8 x 4 =
1,024 bytes, the state page is padded to it; the plan has one group per kind and one tensor
of ``num_blocks x 1,024`` bytes shared by both layers. ``kv("full.0")`` is
``[num_blocks, 2, 8, 2, 8]``, ``state("mamba.0")`` is ``[num_blocks, 32]``; block ``b`` of
one aliases block ``b`` of the other, which is safe because the pool gives each block to one
group at a time.

Block 0 is the null block: nothing here writes it, and the attention helpers never write it
either (slot mappings only name blocks the manager allocated).
"""

from __future__ import annotations

from collections.abc import Iterable

from pagedkv import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.errors import InvalidArgumentError
from pagedkv.planner import KVCachePlan
from pagedkv.torch._deps import torch

__all__ = ["KVCacheTensors"]

#: Specs that store a K and a V vector per token and KV head (MLA, a subclass of full
#: attention, is excluded where it matters).
_KV_SPECS = (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, CrossAttentionSpec)


class KVCacheTensors:
    """Device memory for every layer of a plan, with per-layer views.

    ``dtype`` is the element type of every view; each attention spec's ``dtype_bytes`` must
    equal its item size and each state's ``state_bytes`` must be a multiple of it.
    Allocation is ``torch.empty`` (contents undefined until written) unless ``fill`` is given.

    Raises:
        InvalidArgumentError: a plan without tensors, or a dtype that does not match the
            plan's specs (names the layer and the fix).
    """

    def __init__(
        self,
        plan: KVCachePlan,
        *,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        fill: float | None = None,
    ) -> None:
        if not plan.tensors:
            raise InvalidArgumentError("the plan has no KV-cache tensors (attention-free model)")
        self.plan = plan
        self.dtype = dtype
        self.device = torch.device(device)
        self.num_blocks = plan.num_blocks
        page_bytes = plan.page_size_bytes
        assert page_bytes is not None
        self.page_size_bytes = page_bytes
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.layer_to_spec: dict[str, KVCacheSpec] = {}
        self.layer_to_group = plan.layer_to_group()
        for group in plan.groups:
            for name in group.layer_names:
                _check_dtype(name, group.spec, itemsize, dtype)
                self.layer_to_spec[name] = group.spec
        if page_bytes % itemsize:
            raise InvalidArgumentError(
                f"page of {page_bytes} bytes is not a multiple of {dtype}'s {itemsize} bytes"
            )
        self.page_numel = page_bytes // itemsize
        used_bytes = self.num_blocks * page_bytes
        self.raw: tuple[torch.Tensor, ...] = tuple(
            torch.empty(t.size_bytes, dtype=torch.uint8, device=self.device)
            for t in plan.tensors
        )
        self.pages: tuple[torch.Tensor, ...] = tuple(
            r[:used_bytes].view(dtype).view(self.num_blocks, self.page_numel) for r in self.raw
        )
        self.layer_to_tensor = plan.layer_to_tensor()
        if fill is not None:
            for p in self.pages:
                p.fill_(fill)

    # ------------------------------------------------------------------ views

    def spec(self, layer: str) -> KVCacheSpec:
        """The spec of ``layer`` (its group's spec).

        Raises:
            InvalidArgumentError: ``layer`` is not in the plan.
        """
        try:
            return self.layer_to_spec[layer]
        except KeyError:
            raise InvalidArgumentError(
                f"layer {layer!r} is not in the plan; its layers are {sorted(self.layer_to_spec)}"
            ) from None

    def kv(self, layer: str) -> torch.Tensor:
        """``[num_blocks, 2, block_size, num_kv_heads, head_size]`` view of an attention layer.

        Raises:
            InvalidArgumentError: unknown layer, or not a K/V attention layer.
        """
        spec = self.spec(layer)
        if not isinstance(spec, _KV_SPECS) or isinstance(spec, MLAAttentionSpec):
            raise InvalidArgumentError(
                f"layer {layer!r} ({type(spec).__name__}) has no K/V pages; use latent() for "
                "MLA layers and state() for state layers"
            )
        page = self.pages[self.layer_to_tensor[layer]]
        return page.view(self.num_blocks, 2, spec.block_size, spec.num_kv_heads, spec.head_size)

    def latent(self, layer: str) -> torch.Tensor:
        """``[num_blocks, block_size, head_size]`` view of an MLA layer (one latent per token).

        Raises:
            InvalidArgumentError: unknown layer, or not an MLA layer.
        """
        spec = self.spec(layer)
        if not isinstance(spec, MLAAttentionSpec):
            raise InvalidArgumentError(f"layer {layer!r} ({type(spec).__name__}) is not MLA")
        page = self.pages[self.layer_to_tensor[layer]]
        return page.view(self.num_blocks, spec.block_size, spec.head_size)

    def state(self, layer: str) -> torch.Tensor:
        """``[num_blocks, state_bytes // itemsize]`` view of a state layer: the real state
        at the start of each padded page (a strided view when the page is padded).

        Raises:
            InvalidArgumentError: unknown layer, or not a state layer.
        """
        spec = self.spec(layer)
        if not isinstance(spec, MambaSpec):
            raise InvalidArgumentError(f"layer {layer!r} ({type(spec).__name__}) has no state")
        page = self.pages[self.layer_to_tensor[layer]]
        return page[:, : spec.state_bytes // page.element_size()]

    # ------------------------------------------------------------------ whole blocks

    def fill_blocks(self, block_ids: torch.Tensor | Iterable[int], value: float) -> None:
        """Overwrite whole pages of every tensor (all layers, padding included) with
        ``value``, e.g. NaN to prove freed blocks are never read before being written.

        Raises:
            InvalidArgumentError: an id outside ``[1, num_blocks)`` (the null block is never
                written).
        """
        ids = torch.as_tensor(list(block_ids) if not isinstance(block_ids, torch.Tensor)
                              else block_ids, dtype=torch.long, device=self.device)
        if ids.numel() == 0:
            return
        if int(ids.min()) < 1 or int(ids.max()) >= self.num_blocks:
            raise InvalidArgumentError(
                f"block ids must be in [1, {self.num_blocks}) (0 is the null block), got "
                f"{ids.tolist()}"
            )
        for page in self.pages:
            page[ids] = value

    def block_bytes(self, block_id: int) -> tuple[bytes, ...]:
        """The raw bytes of one block in every tensor (CPU copies), to check that a block
        (e.g. the null block) was never written. O(page size x tensors); needs no numpy."""
        return tuple(
            bytes(p[block_id].contiguous().view(torch.uint8).cpu().tolist()) for p in self.pages
        )

    def check_invariants(self) -> None:
        """Every view lies inside its planned tensor and aliases it. O(layers)."""
        for name, index in self.layer_to_tensor.items():
            raw = self.raw[index]
            assert raw.numel() == self.plan.tensors[index].size_bytes
            page = self.pages[index]
            assert page.data_ptr() == raw.data_ptr(), f"{name}: view does not alias its tensor"
            assert page.numel() * page.element_size() <= raw.numel(), f"{name}: view too large"


def _check_dtype(layer: str, spec: KVCacheSpec, itemsize: int, dtype: torch.dtype) -> None:
    if isinstance(spec, _KV_SPECS) and spec.dtype_bytes != itemsize:
        raise InvalidArgumentError(
            f"layer {layer!r}: the plan stores {spec.dtype_bytes}-byte elements but {dtype} "
            f"has {itemsize}; pass a dtype of {spec.dtype_bytes} bytes"
        )
    if isinstance(spec, MambaSpec) and spec.state_bytes % itemsize:
        raise InvalidArgumentError(
            f"layer {layer!r}: state of {spec.state_bytes} bytes is not a whole number of "
            f"{dtype} elements ({itemsize} bytes)"
        )
