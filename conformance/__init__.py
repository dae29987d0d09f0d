"""Differential conformance suite: pagedkv against vLLM's v1 KV-cache manager.

One process imports both, builds the same KV-cache layout on each side and drives them with
the same seeded random operation sequence, comparing the observable state after every
operation (see ``README.md`` section "Conformance"). Run it with an interpreter that has
vLLM installed and pagedkv's ``src`` on the path::

    PYTHONPATH=src VLLM_PY -m conformance --seeds 200 --ops 300

or from any interpreter, naming the vLLM one (the suite re-runs itself under it)::

    python -m conformance --vllm-python VLLM_PY

Without vLLM, ``python -m conformance --replay tests/conformance/transcripts`` compares
pagedkv with vLLM 0.33's recorded answers (``conformance/transcript.py``; recorded with
``--record DIR``); without vLLM and without ``--replay`` the suite exits 1 with one line
saying why. See ``docs/conformance.md``.
"""

from __future__ import annotations

__all__: list[str] = []
