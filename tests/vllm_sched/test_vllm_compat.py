"""``pagedkv.vllm`` without a supported vLLM: one line naming the fix (runs without vLLM)."""

from __future__ import annotations

import sys
import types

import pytest

from pagedkv.errors import MissingDependencyError


def test_a_missing_vllm_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    import pagedkv.vllm

    with pytest.raises(MissingDependencyError) as err:
        pagedkv.vllm.PagedKVScheduler  # noqa: B018
    assert "pip install 'pagedkv[vllm]'" in str(err.value) and "\n" not in str(err.value)


def test_another_vllm_release_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.32.1"))
    from pagedkv.vllm.compat import require_vllm

    with pytest.raises(MissingDependencyError, match=r"supports vLLM 0\.33\.\*, found 0\.32\.1"):
        require_vllm()


def test_importing_the_package_needs_no_vllm_and_unknown_names_fail() -> None:
    import pagedkv.vllm

    with pytest.raises(AttributeError):
        pagedkv.vllm.NoSuchThing  # noqa: B018
