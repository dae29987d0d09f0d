"""Model configs: a path to a ``config.json`` or the name of one shipped with pagedkv.

>>> "Llama-3.1-8B" in bundled_model_names()
True
>>> config, source, name = load_config("llama-3.1-8b")
>>> source, name, config["model_type"]
('bundled:Llama-3.1-8B.json', 'Llama-3.1-8B', 'llama')
"""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError, InputFileError
from pagedkv.input_files import read_text
from pagedkv.json_input import parse_json

__all__ = ["bundled_model_names", "load_config"]

_BUNDLED_PACKAGE = "pagedkv"
_BUNDLED_DIR = ("data", "model_configs")


def _bundled_folder() -> Traversable:
    folder = resources.files(_BUNDLED_PACKAGE)
    for part in _BUNDLED_DIR:
        folder = folder.joinpath(part)
    return folder


def bundled_model_names() -> list[str]:
    """Names of the configs shipped with pagedkv (file names without ``.json``), sorted."""
    return sorted(
        entry.name[: -len(".json")]
        for entry in _bundled_folder().iterdir()
        if entry.name.endswith(".json")
    )


def _resolve_bundled(model: str) -> str | None:
    """The bundled name ``model`` stands for: exact (case-insensitive, ``.json`` optional),
    else the one bundled name containing it. ``None`` when nothing matches.

    Raises:
        ConfigError: ``model`` is contained in several bundled names.
    """
    query = model.lower().removesuffix(".json")
    names = bundled_model_names()
    for name in names:
        if name.lower() == query:
            return name
    matches = [name for name in names if query in name.lower()]
    if len(matches) > 1:
        raise ConfigError(
            f"model {model!r} matches several bundled configs: {', '.join(matches)}; "
            "give the full name"
        )
    return matches[0] if matches else None


def load_config(model: str) -> tuple[dict[str, Any], str, str]:
    """Read a model's config: a path to a ``config.json`` (or a folder holding one), or a
    bundled name.

    Returns ``(config, source, name)``: the parsed JSON object, the path or
    ``bundled:<file>`` it came from (for error messages), and a display name (the bundled
    name, or the parent folder of a ``config.json``, or the file stem).

    Raises:
        InputFileError: no such file or bundled name; a folder without ``config.json``;
            a binary or non-UTF-8 file; not valid JSON; not a JSON object.
        ConfigError: an ambiguous bundled name.
    """
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputFileError(model, "is a directory without a config.json; give the "
                                 "path of a config.json file or a bundled config name")
        path = path / "config.json"
    if path.is_file():
        text = read_text(path, what="model config (a config.json)")
        source = str(path)
        name = (path.resolve().parent.name if path.name == "config.json" else path.stem) \
            or path.stem
    else:
        bundled = _resolve_bundled(model)
        if bundled is None:
            from pagedkv.planner.gpus import close_matches

            raise InputFileError(
                model,
                "no such file and no bundled config of that name"
                + close_matches(model, bundled_model_names()) + "; bundled configs: "
                + ", ".join(bundled_model_names()),
            )
        entry = _bundled_folder().joinpath(bundled + ".json")
        text = read_text(str(entry), what="bundled config")
        source = f"bundled:{bundled}.json"
        name = bundled
    data = parse_json(text, source)
    if not isinstance(data, dict):
        raise InputFileError(source, f"expected a JSON object, got {type(data).__name__}")
    return data, source, name
