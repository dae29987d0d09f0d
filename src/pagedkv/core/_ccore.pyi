"""Types of the compiled core (``pagedkv/_csrc/ccore.c``); see :mod:`pagedkv.core.native`."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

def hash_plain(
    hasher: Any, hashes: list[bytes], tokens: list[int], start: int, stop: int,
    block_size: int, /,
) -> bool: ...
def sha256(data: bytes, /) -> bytes: ...
def sha256_mode(portable: bool | None = None, /) -> str: ...

class FreeQueue:
    num_free: int
    def __init__(self, num_blocks: int, *, first_id: int = 1) -> None: ...
    def popleft(self) -> int: ...
    def popleft_n(self, n: int, /) -> list[int]: ...
    def remove(self, b: int, /) -> None: ...
    def append(self, b: int, /) -> None: ...
    def append_n(self, ids: Sequence[int], /) -> None: ...
    def prepend_n(self, ids: Sequence[int], /) -> None: ...
    def to_list(self) -> list[int]: ...
    def check_invariants(self) -> list[int]: ...
    def __iter__(self) -> Iterator[int]: ...

def pool_free(
    queue: FreeQueue, ref_cnt: list[int], block_hash: list[Any], ordered: Iterable[int], /
) -> None: ...
def pool_touch(queue: FreeQueue, ref_cnt: list[int], ids: Iterable[int], /) -> None: ...
def pool_take(
    ids: list[int], ref_cnt: list[int], block_hash: list[Any], block_group: list[int],
    index: list[dict[bytes, int]], dups: list[dict[bytes, list[int]]],
    secondary: dict[int, Any], removed: Callable[[list[bytes], int], None],
    evict: Callable[[int], None], /,
) -> int: ...
def index_register(
    blocks: list[int], hashes: list[bytes], start: int, stop: int, index: dict[bytes, int],
    dups: dict[bytes, list[int]], block_hash: list[Any], block_group: list[int], group: int,
    evict: Callable[[int], None], /,
) -> list[int]: ...
def longest_hit(index: dict[bytes, int], hashes: list[bytes], n: int, /) -> list[int]: ...

class DecodeAllocate:
    function: Callable[..., Any]
    manager: Any
    def __init__(
        self, *, function: Callable[..., Any], manager: Any, live_requests: dict[str, Any],
        tables: dict[str, list[int]], num_cached: dict[str, int], pool: Any,
        cache_blocks: Callable[[Any, int], None], zeroing: list[bool], request_type: type,
        block_size: int, max_model_len: int, hash_block_size: int = 0,
        cache_function: Callable[..., Any] | None = None,
    ) -> None: ...
    def cache_blocks(self, request: Any, num_computed_tokens: int, /) -> None: ...
    def __call__(self, request: Any, num_new_tokens: int, /, **kwargs: Any) -> Any: ...

class GroupsAllocate:
    function: Callable[..., Any]
    manager: Any
    def __init__(
        self, *, function: Callable[..., Any], cache_function: Callable[..., Any],
        manager: Any, live_requests: dict[str, Any], pool: Any, zeroing: list[bool],
        new_block_ids: list[list[int]], request_type: type,
        groups: tuple[tuple[Any, ...], ...],
        cache_plan: tuple[tuple[Any, ...], ...],
        max_model_len: int, hash_block_size: int, cache_alignment: int,
        registrar: tuple[Any, ...] | None = None,
    ) -> None: ...
    def cache_blocks(self, request: Any, num_computed_tokens: int, /) -> None: ...
    def __call__(self, request: Any, num_new_tokens: int, /, **kwargs: Any) -> Any: ...

class VllmEntry:
    def __init__(
        self, *, adapter: Any, facade: Any, views: dict[str, Any],
        allocate_function: Callable[..., Any], cache_function: Callable[..., Any],
        wrap: Callable[[Any], Any], empty: Any, admitting: tuple[Any, ...] | None,
        hash_block_size: int,
    ) -> None: ...
    def cache_blocks(self, request: Any, num_computed_tokens: int, /) -> None: ...
    def allocate_slots(self, request: Any, num_new_tokens: int, /, **kwargs: Any) -> Any: ...

# The hybrid kernels (pure twins in pagedkv.core.kernels_hybrid).
def hash_keyed(
    hashes: list[bytes], tokens: list[int], start: int, stop: int, block_size: int,
    parent: bytes, tails: list[bytes], /,
) -> bool: ...
def admit_groups(
    plan: list[tuple[Any, ...]], request_id: str, hit: Any, total_computed: int,
    num_tokens: int, main_tokens: int, headroom: int, num_free: int, ref_cnt: list[int],
    touch: Callable[[list[int]], None], take: Callable[[int], list[int]],
    zeroing: list[bool], new_ids: list[list[int]], /,
) -> tuple[list[int], ...] | None: ...
def record_stored(
    events: list[Any], announced: dict[int, Any], cls: type, blocks: Any, hashes: list[bytes],
    start: int, end: int, skipped: Any, token_ids: Any, block_size: int, lora_id: int | None,
    medium: str | None, lora_name: str | None, extra: list[Any] | None, group: int,
    kind: str | None, window: int | None, /,
) -> None: ...
def window_hit(
    index: dict[bytes, int], block_hashes: list[bytes], stride: int, num_blocks: int,
    need: int, /,
) -> list[int]: ...
def chunk_hit(
    index: dict[bytes, int], block_hashes: list[bytes], stride: int, first: int,
    num_blocks: int, /,
) -> list[int]: ...
def state_hit(
    index: dict[bytes, int], block_hashes: list[bytes], stride: int, num_blocks: int,
    block_size: int, align: int, /,
) -> list[int]: ...
def extra_tails(
    extras: Any, start: int, stop: int, block_size: int, keys_out: list[Any] | None, /,
) -> list[bytes] | None: ...
def mamba_release(
    table: list[int] | None, released: dict[str, int], last_state: dict[str, int],
    request_id: str, num_computed_tokens: int, block_size: int,
    free_blocks: Callable[[list[int]], Any], /,
) -> None: ...
def free_groups(
    plan: list[tuple[Any, ...]], request_id: str, free_blocks: Callable[[list[int]], Any], /,
) -> None: ...
def mamba_grow(
    table: list[int], last_state: dict[str, int], allocated: set[str], request_id: str,
    num_tokens: int, block_size: int, get_new_blocks: Callable[[int], list[int]], /,
) -> list[int]: ...
class HybridHit:
    def __init__(self, plan: tuple[Any, ...], /) -> None: ...
    def __call__(
        self, block_hashes: list[bytes], max_length: int, /,
    ) -> tuple[tuple[list[int], ...], int]: ...
def lookup_request(
    find: Callable[[list[bytes], int], Any], mgr: Any, request: Any, num_tokens: int, /,
) -> Any: ...
def start_request(
    hashes: list[bytes], tokens: Sequence[int], block_size: int, seed: bytes,
    extras: Any, keys_out: list[Any] | None, /,
) -> list[int] | None: ...
def extend_request(
    hashes: list[bytes], tokens: Sequence[int], block_size: int, seed: bytes,
    extras: Any, keys_out: list[Any] | None, /,
) -> bool: ...
