"""Every install command pagedkv prints or documents, and a pip dry run of each.

Collected from: the messages (:func:`pagedkv.doctor.install_command` for every extra, as on a
machine without a GPU), every ``pip install`` literal in ``src/`` (docstrings included), every
shell block and inline code span of README.md and docs/*.md. A shell block is one chain: its
``pip install`` lines run in order in one environment. A command on a line that says
"NVIDIA GPU" is documented as the GPU route: its dry run must bring ``nvidia-*`` packages (so
the words stay true); every other one must bring none.

The dry run (:func:`dry_run`) resolves with pip's ``--dry-run --report`` and
``--ignore-installed`` (a fresh environment; dependencies resolved, nothing installed).
``pagedkv[...]`` and ``.[...]`` stand for their requirements read from pyproject.toml (the
project is not on PyPI; an installed pagedkv meets the bare name). Each later ``pip install``
of a chain resolves with the packages the earlier ones asked for pinned to what they got,
and their indexes added, as if installed.
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_SELF = re.compile(r"^(?:pagedkv|\.)\[([\w,]+)\]$")
_SRC_LITERAL = re.compile(r"pip install '[^']+'|pip install [\w.=<>-]+")
_SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
_INLINE = re.compile(r"`([^`\n]*pip install[^`\n]*)`")


@dataclass
class Documented:
    """One chain of install commands and where it was found."""

    where: str
    steps: list[list[str]]  # each: the arguments after ``pip install``
    gpu_route: bool = False
    text: str = field(default="")


def _pip_steps(command: str) -> list[list[str]]:
    """The argument lists of each ``pip install`` in one shell command line or chain."""
    steps = []
    for segment in re.split(r"&&|\n", command):
        if "install" not in segment:
            continue
        words = shlex.split(segment.split(" #")[0])
        for i, word in enumerate(words[:-1]):
            if (word == "pip" or word.endswith("/pip")) and words[i + 1] == "install":
                steps.append(words[i + 2:])
                break
    return steps


def extras_from_pyproject() -> dict[str, list[str]]:
    """pyproject.toml's extras with ``pagedkv[...]`` self-references expanded."""
    import tomllib

    raw = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]

    def expand(name: str) -> list[str]:
        out: list[str] = []
        for req in raw[name]:
            m = re.match(r"pagedkv\[([\w,]+)\]", req)
            out += [r for n in m.group(1).split(",") for r in expand(n)] if m else [req]
        return list(dict.fromkeys(out))

    return {name: expand(name) for name in raw}


def collect() -> list[Documented]:
    """Every install command the project prints or documents (see the module docstring)."""
    from pagedkv.doctor import EXTRAS, install_command

    found = [Documented(f"install_command({e.name!r})", _pip_steps(c), text=c)
             for e in EXTRAS for c in [install_command(e.name, gpu=False)]]
    for path in sorted((ROOT / "src").rglob("*.py")):
        if path.name == "doctor.py":  # its commands are install_command's, above
            continue
        for literal in _SRC_LITERAL.findall(path.read_text()):
            found.append(Documented(str(path.relative_to(ROOT)), _pip_steps(literal),
                                    text=literal))
    for path in DOCS:
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        for block in _SHELL_BLOCK.findall(text):
            joined = block.replace("\\\n", " ")
            steps = _pip_steps(joined)
            if steps:
                found.append(Documented(rel, steps, text=joined.strip()))
        outside = _SHELL_BLOCK.sub("", text)
        for line in outside.splitlines():
            for span in _INLINE.findall(line):
                steps = _pip_steps(span)
                if steps:
                    found.append(Documented(rel, steps, "NVIDIA GPU" in line, span))
    return found


def _requirements(args: list[str], extras: dict[str, list[str]]) -> list[str]:
    out = []
    for arg in args:
        m = _SELF.match(arg)
        if m:
            out += [r for n in m.group(1).split(",") for r in extras[n]]
        elif arg in ("-e", "--editable", "-q", "--quiet"):
            continue
        elif arg == ".":
            out += []  # the project itself: no dependencies of its own
        else:
            out.append(arg)
    return out


def dry_run(chain: Documented, *, timeout_s: float = 600) -> list[str]:
    """The distributions a fresh install of ``chain`` would bring (names, lower case)."""
    extras = extras_from_pyproject()
    brought: list[str] = []
    pins: list[str] = []
    indexes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for number, args in enumerate(chain.steps):
            reqs = _requirements(args, extras)
            if not [a for a in reqs if not a.startswith("-")]:
                continue
            own = [reqs[i + 1] for i, a in enumerate(reqs[:-1]) if a == "--index-url"]
            constraints = pathlib.Path(tmp, f"pins{number}.txt")
            constraints.write_text("\n".join(pins) + "\n")
            cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                   "--ignore-installed", "--report", "-", "--timeout", "10", "--retries", "1",
                   "--no-input", "-c", str(constraints), *reqs]
            for url in indexes:  # the earlier steps' packages stay findable
                cmd += ["--extra-index-url", url]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            if proc.returncode != 0:
                raise AssertionError(f"{chain.where}: pip could not resolve {args}: "
                                     f"{proc.stderr.strip()[-600:]}")
            report = json.loads(proc.stdout)
            for item in report["install"]:
                name = item["metadata"]["name"].lower()
                brought.append(name)
                if item.get("requested"):  # what a step asked for stays (its dependencies
                    # may move, as a later install may upgrade or downgrade them)
                    pins.append(f"{name}=={item['metadata']['version']}")
            indexes += own
    return brought


def nvidia_packages(names: list[str]) -> list[str]:
    return sorted({n for n in names if n.startswith("nvidia-") or n.startswith("nvidia_")})
