"""The vLLM this package runs against: 0.33, checked once, one line when missing."""

from __future__ import annotations

from pagedkv.errors import MissingDependencyError

__all__ = ["SUPPORTED_VLLM", "require_vllm"]

#: The vLLM release series the scheduler classes are written and tested against.
SUPPORTED_VLLM = "0.33"


def require_vllm() -> str:
    """vLLM's version when a supported vLLM is importable.

    Raises:
        MissingDependencyError: vLLM is not installed, or not a 0.33 release (one line
            naming the fix).
    """
    try:
        import vllm
    except ImportError as e:
        raise MissingDependencyError(
            f"pagedkv.vllm needs vLLM {SUPPORTED_VLLM} (pip install 'pagedkv[vllm]'): {e}"
        ) from None
    version = str(getattr(vllm, "__version__", ""))
    if not version.startswith(SUPPORTED_VLLM + "."):
        raise MissingDependencyError(
            f"pagedkv.vllm supports vLLM {SUPPORTED_VLLM}.*, found {version or 'unknown'}; "
            f"pip install 'vllm=={SUPPORTED_VLLM}.*' or run without --scheduler-cls")
    return version
