"""The vLLM releases this package runs against (0.32 and 0.33), checked once per entry
point, one line when missing; and the table of what differs between them.

Every difference in the files pagedkv mirrors (vLLM's ``v1/core``) is one row of
:data:`DIFFERENCES`: the vLLM member or behaviour, what 0.32 does, what 0.33 does, and how
pagedkv follows it (a ``CacheConfig.vllm_release`` profile decided at construction, a
branch in the adapter, or why the difference cannot show).
"""

from __future__ import annotations

from typing import NamedTuple

from pagedkv.errors import MissingDependencyError

__all__ = ["DIFFERENCES", "SUPPORTED_VLLM", "Difference", "differences_table", "release_of",
           "require_vllm"]

#: The vLLM release series the scheduler classes are written and tested against, oldest
#: first; the newest is ``CacheConfig.vllm_release``'s default.
SUPPORTED_VLLM = ("0.32", "0.33")


class Difference(NamedTuple):
    """One vLLM member or behaviour that differs between 0.32 and 0.33."""

    where: str
    in_032: str
    in_033: str
    pagedkv: str


_PROFILE = "CacheConfig(vllm_release=...)"

#: vLLM 0.32 -> 0.33 in the files pagedkv mirrors, one row each (docs/vllm.md prints it).
DIFFERENCES: tuple[Difference, ...] = (
    Difference("KVCacheManager(num_hash_lookahead_tokens=)", "no such argument",
               "tokens after each block its hash covers",
               f"{_PROFILE}: 0.32 refuses num_hash_lookahead_tokens > 0; the adapter "
               "passes the scheduler's value under 0.33 only"),
    Difference("KVCacheManager.get_computed_blocks(request, max_cache_hit_length=)",
               "no second argument (limit num_tokens - 1)", "optional upper bound",
               "the adapter takes the argument as optional: one signature serves both"),
    Difference("get_computed_blocks_for_connector(..., max_cache_hit_length=)",
               "no second argument", "optional upper bound", "as above"),
    Difference("BlockPool: lookahead tokens in block hashes and stored events",
               "absent", "hashes and BlockStored events cover L more tokens",
               f"{_PROFILE}: lookahead is 0.33 only"),
    Difference("BlockPool.touch / free_blocks on the null block",
               "the null block's ref_cnt counted up and down", "skipped",
               "not observable: the null block never enters the free queue in either"),
    Difference("SingleTypeKVCacheManager.pop_blocks_for_free (and the Mamba override)",
               "the table with its leading null blocks", "leading null blocks trimmed",
               f"{_PROFILE}: pop_blocks_for_free keeps them under 0.32 (release skips them)"),
    Difference("cache_blocks: registered blocks capped at the request's hashed tokens",
               "num_tokens // block_size", "min(num_tokens, hashed tokens) // block_size",
               "equal without lookahead (every full block is hashed), so equal under 0.32"),
    Difference("sparse SWA retention: EAGLE junction boundary (shared_prefix_boundary - bs)",
               "absent", "an extra reachable boundary", "no branch in pagedkv: it needs "
               "EAGLE on a Mamba junction under sparse retention, which neither the "
               "transcripts nor the engine test run (not verified)"),
    Difference("MambaManager: assert mamba_cache_mode == 'align' with caching", "absent",
               "assertion", "pagedkv refuses any other mode under both releases"),
    Difference("Mamba cache_partial_block of a block already keyed at that length",
               "keyed again", "skipped", "no branch in pagedkv; both releases' "
               "full+mamba/unit4 transcripts (partial Mamba keys) replay equal"),
    Difference("KVCacheCoordinator.drop_eagle_group_ids", "eagle_group_ids",
               "eagle_group_ids, or none with lookahead hashes",
               "equal without lookahead, so equal under 0.32"),
    Difference("Scheduler.aux_output_connector", "AuxOutputSchedulerConnector() (holds no manager)",
               "AuxOutputSchedulerConnector(kv_cache_manager, connector)",
               "the adapter rebuilds it over its manager under 0.33, keeps 0.32's"),
    Difference("Scheduler.num_hash_lookahead_tokens", "no such attribute", "int",
               "read under 0.33 only"),
)


def differences_table() -> str:
    """:data:`DIFFERENCES` as the Markdown table docs/vllm.md prints (a test checks it)."""
    rows = ["| vLLM member or behaviour | 0.32 | 0.33 | pagedkv |", "| --- | --- | --- | --- |"]
    rows += [f"| `{d.where}` | {d.in_032} | {d.in_033} | {d.pagedkv} |" for d in DIFFERENCES]
    return "\n".join(rows)


def release_of(version: str) -> str | None:
    """The supported series ``version`` belongs to (``"0.32.0"`` -> ``"0.32"``), else None."""
    for series in SUPPORTED_VLLM:
        if version.startswith(series + "."):
            return series
    return None


def require_vllm() -> str:
    """The series (``"0.32"`` or ``"0.33"``) of the importable vLLM when it is supported.

    Raises:
        MissingDependencyError: vLLM is not installed, or another release (one line
            naming the fix).
    """
    from pagedkv.doctor import install_command

    try:
        import vllm
    except ImportError as e:
        raise MissingDependencyError(
            f"pagedkv.vllm needs vLLM {' or '.join(SUPPORTED_VLLM)} "
            f"({install_command('vllm')}): {e}"
        ) from None
    version = str(getattr(vllm, "__version__", ""))
    series = release_of(version)
    if series is None:
        wanted = " or ".join(s + ".*" for s in SUPPORTED_VLLM)
        raise MissingDependencyError(
            f"pagedkv.vllm supports vLLM {wanted}, found {version or 'unknown'}; "
            f"install a supported one ({install_command('vllm')}) or run without "
            "--scheduler-cls")
    return series
