"""Explicit layer-spec files: parsing, naming, and errors that name the entry."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pagedkv.core.specs import FullAttentionSpec, MambaSpec, SlidingWindowSpec
from pagedkv.errors import InputFileError, MissingDependencyError
from pagedkv.planner import load_layer_file, parse_layer_file, plan_kv_cache

ATTENTION = {"num_kv_heads": 8, "head_size": 128, "dtype_bytes": 2}
DOCUMENT: dict[str, Any] = {
    "name": "toy-hybrid",
    "max_position_embeddings": 32768,
    "num_parameters": 7_000_000_000,
    "layers": [
        {"kind": "full_attention", "count": 2, **ATTENTION},
        {"kind": "sliding_window", "count": 4, "sliding_window": 1024, **ATTENTION},
        {"kind": "mamba", "names": ["mixer.a", "mixer.b"], "state_bytes": 100_000},
    ],
}


def test_parse() -> None:
    loaded = parse_layer_file(DOCUMENT, block_size=32)
    model = loaded.spec
    assert model.name == "toy-hybrid" and model.max_position_embeddings == 32768
    assert loaded.num_parameters == 7_000_000_000 and loaded.weight_dtype == "bf16"
    assert [name for name, _ in model.layer_specs] == [
        "layers.0", "layers.1", "layers.2", "layers.3", "layers.4", "layers.5",
        "mixer.a", "mixer.b"]
    specs = model.layer_to_spec
    assert specs["layers.0"] == FullAttentionSpec(block_size=32, **ATTENTION)
    assert specs["layers.5"] == SlidingWindowSpec(block_size=32, sliding_window=1024,
                                                  **ATTENTION)
    assert specs["mixer.b"] == MambaSpec(block_size=32, state_bytes=100_000)
    plan = plan_kv_cache(specs, available_bytes=1 << 30, max_model_len=4096)
    assert plan.group_size == 2 and len(plan.groups) == 4


def test_load_json(tmp_path: Path) -> None:
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(DOCUMENT))
    assert load_layer_file(path).spec.num_hidden_layers == 8


@pytest.mark.parametrize(("entry", "problem"), [
    ({"kind": "fancy"}, "kind 'fancy' is not one of full_attention"),
    ({"kind": "sliding_window", **ATTENTION}, "kind 'sliding_window' needs sliding_window"),
    ({"kind": "full_attention", "heads": 8, **ATTENTION}, "unknown fields heads"),
    ({"kind": "full_attention", "count": 0, **ATTENTION}, "count must be a positive"),
    ({"kind": "full_attention", **{**ATTENTION, "num_kv_heads": -8}},
     "num_kv_heads must be a positive int"),
    ({"kind": "mamba", "state_bytes": 10, "names": ["a", "b"], "count": 3},
     "count 3 contradicts the 2 names"),
    ("full_attention", "expected an object"),
])
def test_bad_entry_names_entry(entry: Any, problem: str) -> None:
    document = {"layers": [{"kind": "full_attention", **ATTENTION}, entry]}
    with pytest.raises(InputFileError, match=problem) as info:
        parse_layer_file(document, source="my.json")
    assert info.value.key == "layers[1]"
    assert str(info.value).startswith("my.json: key 'layers[1]': ")


def test_duplicate_names_and_empty_layers() -> None:
    layer = {"kind": "mamba", "state_bytes": 10, "names": ["x"]}
    with pytest.raises(InputFileError, match="layer name 'x' used twice"):
        parse_layer_file({"layers": [layer, layer]})
    with pytest.raises(InputFileError, match="expected a non-empty list"):
        parse_layer_file({"layers": []})


def test_yaml_without_pyyaml_is_a_clear_error(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "layers.yaml"
    path.write_text("layers: []\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml -> ImportError
    with pytest.raises(MissingDependencyError, match="needs PyYAML"):
        load_layer_file(path)


def test_yaml_with_pyyaml(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    path = tmp_path / "layers.yml"
    path.write_text(yaml.safe_dump(DOCUMENT))
    assert load_layer_file(path).spec.num_hidden_layers == 8
