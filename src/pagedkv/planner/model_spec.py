"""The KV-cache layers of one model on one tensor-parallel rank, as the readers build them.

>>> from pagedkv.core.specs import FullAttentionSpec
>>> spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype_bytes=2)
>>> model = ModelSpec(name="m", model_type="llama", tp_size=1, kv_dtype="bf16",
...                   layer_specs=(("layers.0", spec),), num_hidden_layers=1,
...                   max_position_embeddings=8192)
>>> model.bytes_per_token, model.kind_to_num_layers
(4096, {'full_attention': 1})
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from pagedkv.core.specs import KVCacheSpec

__all__ = ["KV_DTYPE_BYTES", "MAMBA_MIXERS", "STATE_DTYPE_NAMES", "TORCH_DTYPE_TO_NAME",
           "ModelSpec"]

#: Bytes per element of each KV-cache dtype accepted by ``kv_dtype`` (``auto`` = the
#: model's own dtype).
KV_DTYPE_BYTES: Mapping[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}

#: ``torch_dtype`` spellings in configs (and ``--mamba-ssm-cache-dtype`` values) -> the
#: short names of :data:`KV_DTYPE_BYTES`.
TORCH_DTYPE_TO_NAME: Mapping[str, str] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
}

#: State dtypes a Mamba state may be kept in (``auto``: the family's default).
STATE_DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32")

#: Mixer kinds a reader may report: they decide the prefix-caching (align mode)
#: checkpoints and block alignment of the planner.
MAMBA_MIXERS = ("mamba1", "mamba2", "gated_delta_net")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """The KV-cache layers of one model on one tensor-parallel rank.

    ``layer_specs`` lists ``(layer name, spec)`` in model order; layers without a cache
    (e.g. the MLP-only layers of Nemotron-H) are absent. ``notes`` lists the defaults that
    were assumed for absent config fields. ``mamba_mixer`` names the state mixer of a
    Mamba hybrid (one of :data:`MAMBA_MIXERS`), ``None`` without state layers;
    ``state_dtypes`` the dtypes its state is kept in (conv, then SSM / recurrent).
    """

    name: str
    model_type: str
    tp_size: int
    kv_dtype: str
    layer_specs: tuple[tuple[str, KVCacheSpec], ...]
    num_hidden_layers: int
    max_position_embeddings: int | None
    notes: tuple[str, ...] = ()
    mamba_mixer: str | None = None
    state_dtypes: tuple[str, ...] = ()

    @property
    def layer_to_spec(self) -> dict[str, KVCacheSpec]:
        """Layer name -> spec, in model order."""
        return dict(self.layer_specs)

    @property
    def kind_to_num_layers(self) -> dict[str, int]:
        """Spec kind (``full_attention``, ``sliding_window``, ...) -> number of layers."""
        return dict(Counter(spec.kind for _, spec in self.layer_specs))

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token costs across all layers of this rank (states excluded)."""
        return sum(spec.bytes_per_token for _, spec in self.layer_specs)
