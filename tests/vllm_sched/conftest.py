"""vLLM picks its platform at import: these tests run vLLM's CPU build."""

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
