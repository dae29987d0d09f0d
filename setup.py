"""Build hook: the optional compiled core (``pagedkv.core._ccore``, C, standard library and
Python headers only). Where it cannot be built (no C compiler, no Python headers) the
install goes on without it and pagedkv runs its pure-Python core; ``pagedkv --version``
says which core is in use. Everything else is configured in pyproject.toml."""

from __future__ import annotations

import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_SKIP_LINE = "pagedkv: no C compiler, using the pure-Python core"


class OptionalBuildExt(build_ext):
    """``build_ext`` that never fails the install: a failed compile prints one line."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler found: distutils' platform errors, OSError
            self._skipped(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # the compiler failed on this machine
            self._skipped(exc)

    @staticmethod
    def _skipped(exc: BaseException) -> None:
        detail = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
        print(f"{_SKIP_LINE} ({detail[0][:120]})", file=sys.stderr, flush=True)


_CSRC = os.path.join("src", "pagedkv", "_csrc")
_ARGS = [] if sys.platform == "win32" else ["-O3"]
_CCORE = Extension(
    "pagedkv.core._ccore",
    sources=[os.path.join(_CSRC, name) for name in ("ccore.c", "sha256.c")],
    # Every header: a change to any of them rebuilds the module.
    depends=sorted(glob.glob(os.path.join(_CSRC, "*.h"))),
    extra_compile_args=_ARGS,
)

setup(ext_modules=[_CCORE], cmdclass={"build_ext": OptionalBuildExt})
