"""Grid parsing: files in three formats, --axis/--set, and every bad input refused with
one message naming the fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pagedkv.errors import InputFileError, InvalidArgumentError, MissingDependencyError
from pagedkv.sweep.grid import (
    Grid,
    grid_from_flags,
    grid_from_mapping,
    load_grid_file,
    parse_axis_flag,
    sweepable_names,
)

GRID = {"limit": 50, "gpu": ["H100-SXM", "A100-80GB"], "--tp": [1, 2],
        "host-memory": [None, "1GiB"], "no_bounds": True}


def _check(g: Grid) -> None:
    assert g.fixed == {"limit": 50, "no_bounds": True}
    assert [a.dest for a in g.axes] == ["gpu", "tp", "host_memory"]
    assert g.num_points == 8
    pts = list(g.points())
    assert [p.index for p in pts] == list(range(8))
    assert pts[0].values == {"gpu": "H100-SXM", "tp": 1, "host_memory": None}
    assert pts[1].values["host_memory"] == (1 << 30,)  # parsed as simulate parses it
    assert pts[1].labels == {"gpu": "H100-SXM", "tp": "1", "host_memory": "1GiB"}
    assert pts[-1].values == {"gpu": "A100-80GB", "tp": 2, "host_memory": (1 << 30,)}


def test_json_yaml_toml_files_give_the_same_grid(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text(json.dumps(GRID))
    (tmp_path / "g.yaml").write_text(
        "limit: 50\ngpu: [H100-SXM, A100-80GB]\n--tp: [1, 2]\nhost-memory: [null, 1GiB]\n"
        "no_bounds: true\n")
    (tmp_path / "g.toml").write_text(
        'limit = 50\ngpu = ["H100-SXM", "A100-80GB"]\n"--tp" = [1, 2]\n'
        '"host-memory" = ["none", "1GiB"]\nno_bounds = true\n')
    for name in ("g.json", "g.yaml", "g.toml"):
        _check(load_grid_file(tmp_path / name))


def test_flags_add_to_and_override_the_file(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text(json.dumps({"limit": 50, "tp": [1, 2]}))
    g = grid_from_flags(str(tmp_path / "g.json"), ["tp=1,2,4", "rate-scale=1,2.5"],
                        ["limit=80"])
    assert g.fixed == {"limit": 80}
    assert [(a.dest, a.values) for a in g.axes] == [("tp", (1, 2, 4)),
                                                     ("rate_scale", (1.0, 2.5))]
    assert parse_axis_flag("router=round-robin,cache-aware").axes[0].labels == (
        "round-robin", "cache-aware")


@pytest.mark.parametrize(("data", "needle"), [
    ({"colour": [1, 2]}, "unknown option 'colour'; sweepable options: trace, generator"),
    ({"json": [True, False]}, "not a sweep option"),
    ({"tp": ["one", 2]}, "argument --tp: must be a whole number in [1, 1024], got 'one'"),
    ({"router": ["fastest"]}, "invalid choice: 'fastest'"),
    ({"rate_scale": [float("nan")]}, "not a finite number"),
    ({"rate_scale": [-1]}, "--rate-scale"),
    ({"limit": [10, 20]}, "workload option and takes one value"),
    ({"tp": [1, 1]}, "repeats a value"),
    ({"tp": {"a": 1}}, "not a mapping"),
    ({"tp": [[1, 2]]}, "a value must be text, a number or a boolean"),
    ({"tp": 1, "--tp": [2]}, "given twice"),
    ([1, 2], "a grid is a mapping"),
])
def test_bad_grids_are_refused_by_name(data: object, needle: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        grid_from_mapping(data, where="g.json")
    assert needle in str(info.value)
    assert str(info.value).startswith("g.json: ")


def test_empty_grids(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="no axis"):
        grid_from_mapping({"limit": 5}, where="g").check()
    with pytest.raises(InvalidArgumentError, match="axis 'tp' has no values"):
        grid_from_mapping({"tp": []}, where="g").check()
    (tmp_path / "e.yaml").write_text("# nothing\n")
    with pytest.raises(InvalidArgumentError, match="the grid file is empty"):
        load_grid_file(tmp_path / "e.yaml")
    with pytest.raises(InvalidArgumentError, match="give at least one value"):
        parse_axis_flag("tp=")
    with pytest.raises(InvalidArgumentError, match="write NAME=VALUES"):
        parse_axis_flag("tp")


def test_too_many_points() -> None:
    g = grid_from_mapping({"tp": list(range(1, 401)), "block_size": list(range(1, 401))},
                          where="g")
    with pytest.raises(InvalidArgumentError, match="160,000 points"):
        g.check()


def test_bad_files(tmp_path: Path) -> None:
    cases = {"g.txt": ("tp: [1]", "ends in .yaml"),
             "bad.json": ('{"tp": [1,', "bad.json:1: not valid JSON"),
             "bad.yaml": ("tp: [1, 2\n", "bad.yaml"),
             "bad.toml": ("tp = [1", "not valid TOML"),
             "bin.json": ("\x00\x01", "a binary file")}
    for name, (text, needle) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(InputFileError) as info:
            load_grid_file(tmp_path / name)
        assert needle in str(info.value), name
    with pytest.raises(InputFileError, match="cannot open the grid"):
        load_grid_file(tmp_path / "missing.json")


def test_missing_parsers_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "g.yaml").write_text("tp: [1]\n")
    (tmp_path / "g.toml").write_text("tp = [1]\n")
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(MissingDependencyError, match=r"pagedkv\[yaml\]"):
        load_grid_file(tmp_path / "g.yaml")
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(MissingDependencyError, match="tomli"):
        load_grid_file(tmp_path / "g.toml")


def test_every_simulate_option_but_output_ones_is_sweepable() -> None:
    names = sweepable_names()
    for dest in ("model", "gpu", "tp", "gpu_memory", "num_blocks", "replicas", "router",
                 "retention", "host_memory", "block_size", "rate_scale"):
        assert dest in names
    for dest in ("json", "plot_dir", "calibrate", "jobs", "kv_events_endpoint"):
        assert dest not in names
