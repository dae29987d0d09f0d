"""Fixtures for the planner tests: a helper that runs ``pagedkv plan``."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest

from pagedkv.cli import OneLineParser
from pagedkv.planner import cli

RunPlan = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run_plan() -> RunPlan:
    """Run ``pagedkv plan ARGS...``; returns ``(exit code, stdout, stderr)``. Usage errors
    surface as ``SystemExit`` from argparse."""

    def run(*argv: str) -> tuple[int, str, str]:
        parser = OneLineParser(prog="pagedkv")
        cli.add_parser(parser.add_subparsers())
        args = parser.parse_args(["plan", *argv])
        out, err = io.StringIO(), io.StringIO()
        code = cli.run(args, stdout=out, stderr=err)
        return code, out.getvalue(), err.getvalue()

    return run
