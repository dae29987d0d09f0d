"""The vLLM members the adapter reaches: one table (``pagedkv.vllm.compat.REACHES``),
each member at the line it names in the installed vLLM 0.33, and the adapter's sources
reaching no member the table leaves out. And the release check on every entry point:
the class names via ``pagedkv.vllm``, the plugin, and each submodule that imports vLLM."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM 0.33 is not installed")

from pagedkv.errors import MissingDependencyError  # noqa: E402
from pagedkv.vllm import compat  # noqa: E402

ADAPTER = Path(compat.__file__).parent
VLLM_ROOT = Path(vllm.__file__).parent
LISTED = {r.member for r in compat.REACHES}
#: Every name a listed member is spelled with (classes, modules, members).
NAMES = {part for r in compat.REACHES for part in r.member.split(".")}


SERIES = compat.release_of(str(vllm.__version__))


@pytest.mark.skipif(SERIES is None, reason="lines are 0.32's and 0.33's")
@pytest.mark.parametrize("reach", compat.REACHES, ids=lambda r: r.member)
def test_each_listed_member_is_at_its_line(reach: compat.Reach) -> None:
    """At the 0.33 line under vLLM 0.33, at the 0.32 line (or the same) under 0.32."""
    line = reach.line_033
    if SERIES == "0.32":
        if reach.line_032 < 0:
            pytest.skip("absent in 0.32")
        line = reach.line_032 or reach.line_033
    lines = (VLLM_ROOT / reach.file).read_text().splitlines()
    name = reach.member.rsplit(".", 1)[-1]
    if reach.member == "scheduler.KVCacheManager":  # the import that binds the name
        assert "kv_cache_manager import" in lines[line - 1]
        assert re.search(r"\bKVCacheManager\b", "\n".join(lines[line - 1:line + 4]))
        return
    assert re.search(rf"\b{name}\b", lines[line - 1]), (reach, lines[line - 1])


def _reached() -> set[str]:
    """Every vLLM member the adapter's sources name, as the table spells members."""
    found: set[str] = set()
    roots = {r"\bs": "Scheduler", r"\brequest": "Request", r"\bself\.request": "Request",
             r"\bs\.cache_config": "CacheConfig", r"\bs\.scheduler_config": "SchedulerConfig",
             r"\bs\.kv_cache_config": "KVCacheConfig", r"\bcfg": "VllmConfig",
             r"\bvllm_config": "VllmConfig", r"\bs\.connector": "KVConnectorBase_V1",
             r"\bvk": "kv_events", r"\bvllm_scheduler": "scheduler"}
    for name in ("scheduler", "manager", "blocks", "requests", "extras", "events", "plugin"):
        src = (ADAPTER / f"{name}.py").read_text()
        for root, owner in roots.items():
            for m in re.finditer(rf"{root}\.([A-Za-z_]\w*)\b(?!\s*\.\w)", src):
                found.add(f"{owner}.{m.group(1)}")
            for m in re.finditer(rf"getattr\({root}, \"(\w+)\"", src):
                found.add(f"{owner}.{m.group(1)}")
        for m in re.finditer(r"from vllm[\w.]* import (?:\(([^)]*)\)|([^\n(]+))", src):
            names = re.sub(r"#[^\n]*", "", m.group(1) or m.group(2)).split(",")
            found |= {f"import {n.split(' as ')[0].strip()}" for n in names if n.strip()}
    return found


def test_the_adapter_reaches_only_listed_members() -> None:
    found = _reached()
    assert "Scheduler.kv_cache_manager" in found and "Request.num_in_flight_tokens" in found
    missing = sorted(f for f in found if (f[7:] not in NAMES if f.startswith("import ")
                                          else f not in LISTED))
    # Reads of pagedkv's own manager through the scheduler, and names of the adapter's
    # own objects, are not vLLM members.
    ours = {"Scheduler.kv_cache_manager", "Request.request_id"}
    assert [f for f in missing if f not in ours] == []
    # The group views' vLLM bases are all listed.
    from pagedkv.vllm.blocks import _VLLM_MANAGERS

    for base in set(_VLLM_MANAGERS.values()):
        assert f"single_type_kv_cache_manager.{base}" in LISTED


def test_the_table_renders_one_row_per_member() -> None:
    table = compat.reaches_table()
    assert len(table.splitlines()) == len(compat.REACHES) + 2
    assert "| `Request.num_in_flight_tokens` | v1/request.py |" in table


# ---------------------------------------------------------------- the release check


@pytest.fixture
def old_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM claims an unsupported release; pagedkv.vllm's submodules are imported anew."""
    monkeypatch.setattr(vllm, "__version__", "0.31.1")
    for name in [n for n in sys.modules if n.startswith("pagedkv.vllm.")
                 and n != "pagedkv.vllm.compat"]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("module", ["scheduler", "manager", "blocks", "events"])
def test_each_submodule_checks_the_release(old_vllm: None, module: str) -> None:
    with pytest.raises(MissingDependencyError, match=r"supports vLLM 0\.32\.\* or 0\.33"):
        importlib.import_module(f"pagedkv.vllm.{module}")


def test_the_class_names_check_the_release(old_vllm: None) -> None:
    import pagedkv.vllm

    with pytest.raises(MissingDependencyError, match=r"found 0\.31\.1"):
        pagedkv.vllm.PagedKVAsyncScheduler  # noqa: B018


def test_the_plugin_checks_the_release(old_vllm: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedkv.vllm import plugin

    monkeypatch.setenv(plugin.ENV_VAR, "1")
    with pytest.raises(MissingDependencyError, match=r"found 0\.31\.1"):
        plugin.register()


def test_the_check_runs_once_per_release(monkeypatch: pytest.MonkeyPatch) -> None:
    series = compat.require_vllm()
    monkeypatch.setattr(compat, "release_of", lambda version: pytest.fail("checked again"))
    assert compat.require_vllm() == series


def test_docs_print_the_table() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "vllm.md").read_text()
    assert compat.reaches_table() in doc
