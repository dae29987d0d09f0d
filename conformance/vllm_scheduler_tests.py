"""vLLM 0.33.0's own scheduler tests, run once with vLLM's KV-cache manager and once
with pagedkv's (``pagedkv.vllm``), and a per-file table.

    python conformance/vllm_scheduler_tests.py --vllm-python VLLM_PY

``VLLM_PY`` is an interpreter with vLLM 0.33.0 (CPU build), pytest and tblib installed
(the tests' own conftest imports tblib). The script

1. fetches the vLLM 0.33.0 sdist from PyPI without building anything: it reads the
   file's URL and SHA-256 from PyPI's simple index (JSON form), downloads it with urllib
   and checks the digest against the index and against :data:`SDIST_SHA256` (or takes
   ``--sdist PATH``, checked the same way);
2. extracts only ``tests/`` into ``--cache`` (default ``~/.cache/pagedkv/vllm-0.33.0``);
3. builds an offline Hugging Face cache in a temporary directory holding only the public
   ``config.json`` of ``facebook/opt-125m`` (``conformance/data/``), which is all the
   tests read of a model;
4. runs :data:`TEST_FILES` under ``VLLM_PY`` with ``VLLM_TARGET_DEVICE=cpu``, stock, then
   with ``-p conformance.vllm_substitute`` (pagedkv's schedulers in place of vLLM's);
5. prints, per file, the cases, those passing stock, those passing with pagedkv (and how
   many of them built a pagedkv scheduler: the others test vLLM's manager or helpers
   directly and never reach pagedkv), the stock-passing cases failing with pagedkv and
   those pagedkv refuses at construction (with the reason), then every such case by name.

Exit 0 when every case that passes stock passes with pagedkv or is an explicit refusal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VERSION = "0.33.0"
SDIST = f"vllm-{VERSION}.tar.gz"
#: SHA-256 of vllm-0.33.0.tar.gz as PyPI lists it.
SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
INDEX_URL = "https://pypi.org/simple/vllm/"
TEST_FILES = (
    "test_scheduler.py",
    "test_async_scheduler.py",
    "test_deferred_block_free.py",
    "test_swa_inflight_window_free.py",
    "test_prefix_replay.py",
    "test_worker_slot_overflow.py",
    "test_kv_sharing.py",
    "test_mamba_align_chunk_split.py",
)
SMOKE_FILES = ("test_swa_inflight_window_free.py", "test_kv_sharing.py")
REFUSAL_MARK = "pagedkv.vllm refuses"
#: Cases that test vLLM's manager's own internals rather than the scheduler: reported as
#: refused, with the reason, when they fail with pagedkv.
NOT_APPLICABLE: dict[str, str] = {}
HF_COMMIT = "0" * 40


class RunnerError(Exception):
    """A step failed; the message is one line."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _index_entry() -> tuple[str, str]:
    req = urllib.request.Request(
        INDEX_URL, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    for f in files:
        if f["filename"] == SDIST:
            return f["url"], f["hashes"]["sha256"]
    raise RunnerError(f"{SDIST} is not on {INDEX_URL}")


def fetch_sdist(cache: Path, given: Path | None) -> Path:
    """The verified sdist in ``cache`` (downloaded once)."""
    target = cache / SDIST
    if given is not None:
        shutil.copyfile(given, target)
    elif not target.exists():
        url, digest = _index_entry()
        if digest != SDIST_SHA256:
            raise RunnerError(f"PyPI lists sha256 {digest} for {SDIST}, expected {SDIST_SHA256}")
        print(f"downloading {url}", file=sys.stderr)
        part = target.with_suffix(".part")
        with urllib.request.urlopen(url, timeout=600) as r, part.open("wb") as out:
            shutil.copyfileobj(r, out)
        part.replace(target)
    if _sha256(target) != SDIST_SHA256:
        target.unlink()
        raise RunnerError(f"{SDIST}: sha256 mismatch (expected {SDIST_SHA256}); removed it")
    return target


def extract_tests(sdist: Path, cache: Path) -> Path:
    """``cache/vllm-0.33.0`` holding only the sdist's ``tests/``."""
    root = cache / f"vllm-{VERSION}"
    if (root / "tests" / "v1" / "core" / "utils.py").exists():
        return root
    prefix = f"vllm-{VERSION}/tests/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(cache, members=members, filter="data")
    return root


def make_hf_cache(where: Path) -> Path:
    snap = where / "hub" / "models--facebook--opt-125m" / "snapshots" / HF_COMMIT
    snap.mkdir(parents=True)
    shutil.copyfile(REPO / "conformance" / "data" / "opt-125m-config.json",
                    snap / "config.json")
    refs = snap.parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text(HF_COMMIT)
    return where


def run_side(python: str, root: Path, hf: Path, files: list[str], pagedkv: bool,
             xml: Path, keyword: str | None) -> None:
    env = dict(os.environ, HF_HOME=str(hf), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_TARGET_DEVICE="cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), str(root)])
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           *[f"tests/v1/core/{f}" for f in files]]
    if pagedkv:
        cmd[3:3] = ["-p", "conformance.vllm_substitute"]
        env["PAGEDKV_VLLM_BUILT"] = str(xml.with_suffix(".built"))
    if keyword:
        cmd += ["-k", keyword]
    side = "pagedkv" if pagedkv else "stock"
    print(f"running {len(files)} files with {side}'s manager ...", file=sys.stderr)
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if not xml.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise RunnerError(f"pytest ({side}) produced no report: {' | '.join(tail)}")


def outcomes(xml: Path) -> dict[str, tuple[str, str]]:
    """Case id -> (outcome, message): passed, failed, skipped, or refused."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        # A module that failed to import is reported as one case without a class name.
        cid = f"{classname}::{name}" if classname else f"{name}::<collection>"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None and cid in NOT_APPLICABLE:
            out[cid] = ("refused", "not applicable: " + NOT_APPLICABLE[cid])
        elif bad is not None:
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            line = next((ln for ln in text.splitlines() if REFUSAL_MARK in ln), None)
            out[cid] = ("refused", line.strip()) if line else (
                "failed", (bad.get("message") or "").splitlines()[0][:160]
                if bad.get("message") else "")
        elif case.find("skipped") is not None:
            out[cid] = ("skipped", "")
        else:
            out[cid] = ("passed", "")
    return out


def read_built(path: Path) -> set[str]:
    """Case ids (as :func:`outcomes` names them) of the tests that built a pagedkv
    scheduler (written by ``conformance.vllm_substitute``)."""
    if not path.exists():
        return set()
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("::")  # file.py[::Class]::test[params]
        module = parts[0][:-3].replace("/", ".")
        out.add(".".join([module, *parts[1:-1]]) + "::" + parts[-1])
    return out


def table(stock: dict[str, tuple[str, str]], paged: dict[str, tuple[str, str]],
          files: list[str], built: set[str], have_stock: bool = True
          ) -> tuple[str, list[str], bool]:
    rows = ["| file | cases | stock passed | pagedkv passed | of which built a pagedkv "
            "scheduler | failed with pagedkv | refused | pagedkv only |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    details: list[str] = []
    ok = True
    totals = [0] * 7
    for f in files:
        mod = "tests.v1.core." + f[:-3]
        ids = sorted(c for c in stock.keys() | paged.keys() if c.split("::")[0] == mod)
        s_pass = [c for c in ids if stock.get(c, ("",))[0] == "passed"]
        p_pass = [c for c in ids if paged.get(c, ("",))[0] == "passed"]
        refused = [c for c in s_pass if paged.get(c, ("",))[0] == "refused"]
        failed = [c for c in s_pass if paged.get(c, ("missing",))[0] not in ("passed", "refused")]
        only = [c for c in p_pass if c not in s_pass]
        on_pagedkv = [c for c in p_pass if c in built]
        counts = [len(ids), len(s_pass), len(p_pass), len(on_pagedkv), len(failed),
                  len(refused), len(only)]
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
        rows.append(f"| {f} | " + " | ".join(map(str, counts)) + " |")
        ok = ok and not failed
        if have_stock and not s_pass:
            ok = False
            broken = next((stock[c][1] for c in ids if c in stock and stock[c][0] == "failed"),
                          "no case collected")
            details.append(f"BROKEN  {f}: no case passes with vLLM's own manager ({broken}); "
                           "fix the vLLM environment first")
        details += [f"FAILED  {c}: {paged.get(c, ('missing', ''))[1]}" for c in failed]
        details += [f"REFUSED {c}: {paged[c][1]}" for c in refused]
    rows.append("| **all** | " + " | ".join(f"**{t}**" for t in totals) + " |")
    return "\n".join(rows), details, ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-python", default=sys.executable,
                   help="interpreter with vLLM 0.33.0, pytest and tblib (default: this one)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "pagedkv" /
                   f"vllm-{VERSION}", help="where the sdist and its tests are kept")
    p.add_argument("--sdist", type=Path, help=f"a local {SDIST} (checked by sha256)")
    p.add_argument("--side", choices=("both", "stock", "pagedkv"), default="both")
    p.add_argument("--smoke", action="store_true", help=f"only {', '.join(SMOKE_FILES)}")
    p.add_argument("--files", nargs="+", help="test files (default: all eight)")
    p.add_argument("-k", dest="keyword", help="pytest -k expression")
    p.add_argument("--keep-xml", type=Path, help="copy the two junit reports here")
    args = p.parse_args(argv)
    if os.sep in args.vllm_python:  # a path, not a command on PATH: the tests run elsewhere
        args.vllm_python = os.path.abspath(args.vllm_python)  # (abspath: keep the venv link)
    files = list(args.files or (SMOKE_FILES if args.smoke else TEST_FILES))
    try:
        args.cache.mkdir(parents=True, exist_ok=True)
        root = extract_tests(fetch_sdist(args.cache, args.sdist), args.cache)
        with tempfile.TemporaryDirectory(prefix="pagedkv-vllm-tests-") as tmp:
            hf = make_hf_cache(Path(tmp) / "hf")
            results = {}
            built: set[str] = set()
            for side in ("stock", "pagedkv"):
                if args.side in (side, "both"):
                    xml = Path(tmp) / f"{side}.xml"
                    run_side(args.vllm_python, root, hf, files, side == "pagedkv", xml,
                             args.keyword)
                    results[side] = outcomes(xml)
                    if side == "pagedkv":
                        built = read_built(xml.with_suffix(".built"))
                    if args.keep_xml:
                        args.keep_xml.mkdir(parents=True, exist_ok=True)
                        for f in (xml, xml.with_suffix(".built")):
                            if f.exists():
                                shutil.copyfile(f, args.keep_xml / f.name)
    except (RunnerError, OSError, tarfile.TarError, ET.ParseError) as e:
        print(f"vllm_scheduler_tests: {e}", file=sys.stderr)
        return 1
    stock = results.get("stock", {})
    paged = results.get("pagedkv", stock)
    text, details, ok = table(stock if stock else paged, paged, files, built, bool(stock))
    print(text)
    for line in details:
        print(line)
    if args.side == "both":
        print("verdict: " + ("PASS" if ok else "FAIL"))
    return 0 if ok or args.side != "both" else 1


if __name__ == "__main__":
    sys.exit(main())
