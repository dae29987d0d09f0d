"""The grid of a sweep: fixed ``simulate`` options and axes, from a file or ``--axis``.

A grid file (YAML, JSON or TOML, told by its extension) is one mapping of ``simulate``
option names (``gpu`` or ``--gpu``; ``-`` and ``_`` alike) to values: a **list** is an
axis, anything else a fixed value (``null`` / ``none``: the option's default). The points
are the Cartesian product of the axes, in the order written, the last axis varying
fastest. Every value is converted exactly as ``pagedkv simulate`` converts its text
(:func:`pagedkv.sim.options.parse_option_value`).

>>> g = grid_from_mapping({"limit": 50, "gpu": ["H100-SXM", "A100-80GB"],
...                        "replicas": [1, 2]}, where="grid")
>>> [a.dest for a in g.axes], g.fixed
(['gpu', 'replicas'], {'limit': 50})
>>> [p.values for p in g.points()][:2]
[{'gpu': 'H100-SXM', 'replicas': 1}, {'gpu': 'H100-SXM', 'replicas': 2}]
>>> grid_from_mapping({"colour": ["red"]}, where="grid")
Traceback (most recent call last):
...
pagedkv.errors.InvalidArgumentError: grid: unknown option 'colour'; sweepable options: ...
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.errors import InputFileError, InvalidArgumentError
from pagedkv.input_files import load_document
from pagedkv.sim.options import OPTIONS, option, parse_option_value
from pagedkv.sim.setup import GENERATOR_PARAMS

__all__ = ["FIXED_ONLY", "MAX_POINTS", "NOT_SWEEPABLE", "Axis", "Grid", "Point",
           "grid_from_mapping", "load_grid_file", "parse_axis_flag", "parse_set_flag",
           "sweepable_names"]

#: Options that shape the output of one ``simulate`` run, not the simulated deployment.
NOT_SWEEPABLE = frozenset({
    "calibrate", "save_calibration", "json", "plot_dir", "no_plots", "no_progress", "jobs",
    "capacity_sweep", "find_capacity", "no_find_capacity", "ttft_p99", "tpot_p99",
    "kv_events_endpoint",
    "kv_events_replay_endpoint", "kv_events_topic", "kv_events_form",
    "kv_events_allow_remote", "metrics_port", "metrics_linger_s", "explain_misses",
    "ghost_entries"})
#: The workload options: one workload per sweep (it is loaded once and shared), so these
#: take one value, never an axis.
FIXED_ONLY = frozenset({
    "trace", "generator", "trace_format", "session_stagger_s", "trace_block_size", "limit",
    "skip_bad_lines", *(d for m in GENERATOR_PARAMS.values() for d in m)})
#: Most points a grid may have.
MAX_POINTS = 100_000
_NONE_WORDS = ("none", "null", "default")


def sweepable_names() -> list[str]:
    """The option names (dests) a grid may set, in ``simulate --help`` order."""
    return [o.dest for o in OPTIONS if o.dest not in NOT_SWEEPABLE]


@dataclass(frozen=True, slots=True)
class Axis:
    """One swept option: its dest, the values as written (``labels``) and as parsed."""

    dest: str
    labels: tuple[str, ...]
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Point:
    """One grid point: ``index`` in grid order, ``values`` (axis dest -> parsed value)
    and ``labels`` (axis dest -> the value as written)."""

    index: int
    values: dict[str, Any]
    labels: dict[str, str]


@dataclass(frozen=True, slots=True)
class Grid:
    """Fixed option values (dest -> parsed value) and the axes, in order."""

    fixed: dict[str, Any]
    axes: tuple[Axis, ...]

    @property
    def num_points(self) -> int:
        return math.prod(len(a.values) for a in self.axes)

    def points(self) -> Iterator[Point]:
        """The points in grid order (the last axis fastest)."""
        ranges = [range(len(a.values)) for a in self.axes]
        for index, picks in enumerate(itertools.product(*ranges)):
            yield Point(index=index,
                        values={a.dest: a.values[k] for a, k in zip(self.axes, picks,
                                                                    strict=True)},
                        labels={a.dest: a.labels[k] for a, k in zip(self.axes, picks,
                                                                    strict=True)})

    def merged(self, other: Grid) -> Grid:
        """This grid with ``other``'s fixed values and axes added (``other`` wins on a
        name both set)."""
        names = {a.dest for a in other.axes} | set(other.fixed)
        fixed = {k: v for k, v in self.fixed.items() if k not in names}
        fixed.update(other.fixed)
        axes = tuple(a for a in self.axes if a.dest not in names) + other.axes
        return Grid(fixed=fixed, axes=axes)

    def check(self) -> None:
        """Refuse an empty grid or one with too many points.

        Raises:
            InvalidArgumentError: naming the fix.
        """
        if not self.axes:
            raise InvalidArgumentError(
                "the grid has no axis: give a list of values for at least one option "
                "(in the grid file, or --axis NAME=V1,V2)")
        empty = [a.dest for a in self.axes if not a.values]
        if empty:
            raise InvalidArgumentError(f"axis {empty[0]!r} has no values: give at least one")
        if self.num_points > MAX_POINTS:
            raise InvalidArgumentError(f"the grid has {self.num_points:,} points, more than "
                                       f"{MAX_POINTS:,}: split it into several sweeps")


def _dest(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(f"{where}: an option name must be text, got {name!r}")
    text = name.strip()
    dest = (text[2:] if text.startswith("--") else text).replace("-", "_")
    try:
        o = option(dest)
    except InvalidArgumentError:
        o = None
    if o is None or o.dest in NOT_SWEEPABLE:
        why = "unknown option" if o is None else "not a sweep option (it shapes one run's output)"
        raise InvalidArgumentError(f"{where}: {why} {name!r}; sweepable options: "
                                   f"{', '.join(sweepable_names())}")
    return o.dest


def _text(value: Any, dest: str, where: str) -> str | None:
    """A grid value as the command line's text (None: the default)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidArgumentError(f"{where}: {dest}: {value!r} is not a finite number")
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, str):
        return None if value.strip().lower() in _NONE_WORDS else value
    raise InvalidArgumentError(f"{where}: {dest}: a value must be text, a number or a "
                               f"boolean, got {type(value).__name__} {value!r}")


def _parse(dest: str, value: Any, where: str) -> tuple[str, Any]:
    text = _text(value, dest, where)
    if text is None:
        return "default", option(dest).default
    try:
        return text, parse_option_value(dest, text)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{where}: {exc}") from None


def grid_from_mapping(data: Any, *, where: str) -> Grid:
    """The grid a decoded file holds (module docstring); ``where`` names it in errors.

    Raises:
        InvalidArgumentError: not a mapping, an unknown or unsweepable option, a value
            the command line refuses, a workload option given as an axis.
    """
    if not isinstance(data, Mapping):
        raise InvalidArgumentError(f"{where}: a grid is a mapping of simulate options to "
                                   f"values or lists of values, got {type(data).__name__}")
    fixed: dict[str, Any] = {}
    axes: list[Axis] = []
    seen: set[str] = set()
    for name, raw in data.items():
        dest = _dest(name, where)
        if dest in seen:
            raise InvalidArgumentError(f"{where}: option {dest!r} is given twice")
        seen.add(dest)
        if isinstance(raw, (list, tuple)):
            if dest in FIXED_ONLY:
                raise InvalidArgumentError(
                    f"{where}: {dest!r} is a workload option and takes one value: a sweep "
                    "replays one workload (run one sweep per workload)")
            parsed = [_parse(dest, v, where) for v in raw]
            labels = tuple(t for t, _ in parsed)
            if len(set(labels)) != len(labels):
                raise InvalidArgumentError(f"{where}: axis {dest!r} repeats a value")
            axes.append(Axis(dest, labels, tuple(v for _, v in parsed)))
        elif isinstance(raw, Mapping):
            raise InvalidArgumentError(f"{where}: {dest}: a value must be one value or a "
                                       "list of values, not a mapping")
        else:
            fixed[dest] = _parse(dest, raw, where)[1]
    return Grid(fixed=fixed, axes=tuple(axes))


def load_grid_file(path: str | Path) -> Grid:
    """The grid in a ``.yaml``/``.yml``, ``.json`` or ``.toml`` file.

    Raises:
        InputFileError: unreadable, not the format its name says, binary.
        InvalidArgumentError: as :func:`grid_from_mapping`.
        MissingDependencyError: YAML without PyYAML, TOML on 3.10 without tomli.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json", ".toml"):
        raise InputFileError(str(p), "a grid file ends in .yaml, .yml, .json or .toml")
    data = load_document(p, what="grid")
    if data is None:
        raise InvalidArgumentError(f"{p}: the grid file is empty: give at least one axis")
    return grid_from_mapping(data, where=str(p))


def _split_flag(text: str, flag: str) -> tuple[str, str]:
    name, sep, values = text.partition("=")
    if not sep or not name.strip():
        raise InvalidArgumentError(f"{flag} {text!r}: write NAME=VALUE"
                                   + ("S (comma-separated)" if flag == "--axis" else ""))
    return name.strip(), values


def parse_axis_flag(text: str) -> Grid:
    """``--axis NAME=V1,V2,...`` as a one-axis grid.

    >>> parse_axis_flag("tp=1,2").axes[0].values
    (1, 2)

    Raises:
        InvalidArgumentError: no ``=``, an unknown option or a refused value.
    """
    name, values = _split_flag(text, "--axis")
    parts = [v.strip() for v in values.split(",")]
    if not any(parts):
        raise InvalidArgumentError(f"--axis {text!r}: give at least one value")
    return grid_from_mapping({name: parts}, where="--axis")


def parse_set_flag(text: str) -> Grid:
    """``--set NAME=VALUE``: one fixed option.

    >>> parse_set_flag("limit=100").fixed
    {'limit': 100}
    """
    name, value = _split_flag(text, "--set")
    return grid_from_mapping({name: value.strip()}, where="--set")


def grid_from_flags(grid_file: str | None, axes: Sequence[str], sets: Sequence[str]) -> Grid:
    """The grid of a command line: the file's, then each ``--set`` and ``--axis``."""
    grid = load_grid_file(grid_file) if grid_file else Grid(fixed={}, axes=())
    for s in sets:
        grid = grid.merged(parse_set_flag(s))
    for a in axes:
        grid = grid.merged(parse_axis_flag(a))
    return grid
