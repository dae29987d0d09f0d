"""Misuse at the façade boundary: every bad call raises the documented exception, its
message names the problem and the fix, and the manager's state is byte-identical before
and after (``repr(debug_state())``).

One row per misuse: calls that would corrupt the state, and nonsense that was once accepted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pagedkv import (
    CacheConfig,
    ComputedBlocks,
    ConfigError,
    FullAttentionSpec,
    HashExtras,
    InvalidArgumentError,
    KVCacheManager,
    LoRA,
    MultiModalItem,
    PagedKVError,
    Request,
    SlidingWindowSpec,
    UnknownRequestError,
)
from pagedkv.errors import DuplicateRequestError, InvalidHitError

BS = 4
HEADS = {"num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}
PROMPT = list(range(100, 113))  # 13 tokens: 3 full blocks


@dataclass
class Scene:
    """A manager with history: ``a`` live (3 cached blocks + 1), ``b`` finished and freed
    (its blocks cached), ``c`` new with a hit on ``a``'s prefix (not allocated yet),
    ``other`` a second manager with the same history."""

    mgr: KVCacheManager
    a: Request
    b: Request
    c: Request
    hit_c: ComputedBlocks
    other: KVCacheManager
    hit_other: ComputedBlocks


def _manager(**options: Any) -> KVCacheManager:
    return KVCacheManager.from_spec(FullAttentionSpec(block_size=BS, **HEADS), num_blocks=16,
                                    max_model_len=32, enable_events=True, **options)


def _history(mgr: KVCacheManager) -> tuple[Request, Request]:
    a = mgr.new_request("a", PROMPT)
    assert mgr.allocate_slots(a, len(PROMPT)) is not None
    a.num_computed_tokens = len(PROMPT)
    b = mgr.new_request("b", [7] * 9)
    assert mgr.allocate_slots(b, 9) is not None
    b.num_computed_tokens = 9
    mgr.free(b)
    return a, b


def scene() -> Scene:
    mgr = _manager()
    a, b = _history(mgr)
    c = mgr.new_request("c", PROMPT + [1, 2])
    hit_c = mgr.get_computed_blocks(c)
    assert hit_c.num_computed_tokens == 12
    other = _manager()
    _history(other)
    c2 = other.new_request("c", PROMPT + [1, 2])
    return Scene(mgr, a, b, c, hit_c, other, other.get_computed_blocks(c2))


def forged(s: Scene, blocks: list[Any], n: int) -> ComputedBlocks:
    """A hit stamped as this manager's for ``c`` but with made-up blocks."""
    return ComputedBlocks((blocks,), n, s.mgr.issuer_token, "c")


@dataclass
class Staged:
    """A misuse that needs a legitimate step first (taken before the state snapshot)."""

    prepare: Callable[[Scene], Any]
    act: Callable[[Scene], Any]

    def __call__(self, s: Scene) -> Any:
        return self.act(s)


def _evict_hit_block(s: Scene) -> None:
    s.mgr.evict_blocks([s.hit_c.block_ids[0][2]])  # the hit's block 2 leaves the index


def _grow_b(s: Scene) -> None:
    s.b.append_output_tokens(5)  # b still says 9 computed, but its blocks were freed


stale = Staged(_evict_hit_block,
               lambda s: s.mgr.allocate_slots(s.c, 3, new_computed_blocks=s.hit_c))
mutated = Staged(lambda s: s.hit_c.block_ids[0].append(s.hit_c.block_ids[0][0]),
                 lambda s: s.mgr.allocate_slots(s.c, 3, new_computed_blocks=s.hit_c))
computed_after_free = Staged(_grow_b, lambda s: s.mgr.allocate_slots(s.b, 1))
hit_for_live = Staged(lambda s: setattr(s, "hit_c", s.mgr.get_computed_blocks(s.a)),
                      lambda s: s.mgr.allocate_slots(s.a, 1, new_computed_blocks=s.hit_c))

Call = Callable[[Scene], Any]

# (name, call, exception type, problem pattern, fix pattern)
CASES: list[tuple[str, Call, type[PagedKVError], str, str]] = [
    # -- corrupting misuse: request ids
    ("new_request with a live id", lambda s: s.mgr.new_request("a", [1, 2, 3]),
     DuplicateRequestError, "'a' belongs to a live request", "free it first|another id"),
    ("a second object with a live id allocates",
     lambda s: s.mgr.allocate_slots(Request("a", [1, 2, 3]), 3),
     DuplicateRequestError, "another live request object", "free the other one"),
    ("freeing a second object with a live id",
     lambda s: s.mgr.free(Request("a", [1, 2, 3])),
     DuplicateRequestError, "would free that one's blocks", r"free by id"),
    ("allocate on a freed request that still counts computed tokens", computed_after_free,
     InvalidArgumentError, "holds no blocks", "set it to 0"),
    ("None as a request id", lambda s: s.mgr.new_request(None, [1, 2]),  # type: ignore[arg-type]
     InvalidArgumentError, "non-empty strings, got None", "str()"),
    ("an int request id", lambda s: s.mgr.new_request(5, [1, 2]),  # type: ignore[arg-type]
     InvalidArgumentError, "non-empty strings, got 5", "str()"),
    ("an empty request id", lambda s: s.mgr.new_request("", [1, 2]),
     InvalidArgumentError, "non-empty strings", "str()"),
    ("a Request with an int id allocates",
     lambda s: s.mgr.allocate_slots(Request(7, [1, 2]), 2),  # type: ignore[arg-type]
     InvalidArgumentError, "non-empty strings, got 7", "str()"),
    # -- corrupting misuse: hits
    ("a hit from another manager",
     lambda s: s.mgr.allocate_slots(s.c, 3, new_computed_blocks=s.hit_other),
     InvalidHitError, "another manager", "get_computed_blocks returned"),
    ("a hit issued for another request",
     lambda s: s.mgr.allocate_slots(s.mgr.new_request("d", PROMPT + [1, 2]), 3,
                                    new_computed_blocks=s.hit_c),
     InvalidHitError, "issued for request 'c'", "for this request"),
    ("a forged hit without a stamp",
     lambda s: s.mgr.allocate_slots(s.c, 3, new_computed_blocks=ComputedBlocks(
         (list(s.hit_c.block_ids[0]),), 12)),
     InvalidHitError, "another manager", "get_computed_blocks returned"),
    ("a forged hit on blocks another request holds (other content)",
     lambda s: s.mgr.allocate_slots(s.c, 11, new_computed_blocks=forged(
         s, s.mgr.get_block_ids("a")[0][1:2], 4)),
     InvalidHitError, "no longer hold this request's prefix", "look it up again"),
    ("a forged hit on blocks never cached", lambda s: s.mgr.allocate_slots(
        s.c, 7, new_computed_blocks=forged(s, [14, 15], 8)),
     InvalidHitError, "no longer hold this request's prefix", "look it up again"),
    ("a forged hit with block id 999", lambda s: s.mgr.allocate_slots(
        s.c, 11, new_computed_blocks=forged(s, [999], 4)),
     InvalidHitError, "must be in 1..15", "look it up again"),
    ("a forged hit with a negative block id", lambda s: s.mgr.allocate_slots(
        s.c, 11, new_computed_blocks=forged(s, [-1], 4)),
     InvalidHitError, "must be in 1..15", "look it up again"),
    ("a forged hit with a str block id", lambda s: s.mgr.allocate_slots(
        s.c, 11, new_computed_blocks=forged(s, ["1"], 4)),
     InvalidHitError, "must be ints", "look it up again"),
    ("a forged hit whose length disagrees", lambda s: s.mgr.allocate_slots(
        s.c, 3, new_computed_blocks=forged(s, list(s.hit_c.block_ids[0][:2]), 8)._replace(
            num_computed_tokens=12)),
     InvalidHitError, "cannot hold a 12-token hit", "look it up again"),
    ("a hit covering the whole request", lambda s: s.mgr.allocate_slots(
        s.c, 1, new_computed_blocks=s.hit_c._replace(num_computed_tokens=15)),
     InvalidHitError, "15 tokens for a 15-token request", "look it up again"),
    ("a stale hit (a block evicted since the lookup)", stale,
     InvalidHitError, "no longer hold this request's prefix", "look it up again"),
    ("a hit altered after the lookup", mutated,
     InvalidHitError, "cannot hold a 12-token hit", "look it up again"),
    ("a plain tuple as the hit", lambda s: s.mgr.allocate_slots(
        s.c, 3, new_computed_blocks=((1, 2, 3), 12)),  # type: ignore[arg-type]
     InvalidHitError, "must be the ComputedBlocks", "get_computed_blocks returned"),
    ("hit blocks for a request that holds blocks", hit_for_live,
     InvalidArgumentError, "already holds blocks", "first allocate_slots call"),
    ("num_new_computed_tokens without a hit", lambda s: s.mgr.allocate_slots(
        s.c, 3, num_new_computed_tokens=12),
     InvalidArgumentError, "num_new_computed_tokens=12 but the hit holds 0", "leave it out"),
    ("num_new_computed_tokens unlike the hit", lambda s: s.mgr.allocate_slots(
        s.c, 3, new_computed_blocks=s.hit_c, num_new_computed_tokens=8),
     InvalidArgumentError, "num_new_computed_tokens=8 but the hit holds 12", "leave it out"),
    # -- corrupting misuse: lengths and counts
    ("a prompt longer than max_model_len",
     lambda s: s.mgr.new_request("long", list(range(33))),
     InvalidArgumentError, "33-token prompt is longer than max_model_len=32",
     "truncate it|raise max_model_len"),
    ("an over-long Request allocates",
     lambda s: s.mgr.allocate_slots(Request("long", list(range(40))), 40),
     InvalidArgumentError, "40 tokens, more than max_model_len=32", "finish it"),
    ("an over-long Request is looked up",
     lambda s: s.mgr.get_computed_blocks(Request("long", list(range(40)))),
     InvalidArgumentError, "40 tokens, more than max_model_len=32", "finish it"),
    ("a live request grown past max_model_len", lambda s: (
        s.a.append_output_tokens(list(range(20))),
        s.mgr.allocate_slots(s.a, 20))[1],
     InvalidArgumentError, "33 tokens, more than max_model_len=32", "finish it"),
    ("num_computed_tokens above the token count", lambda s: (
        setattr(s.c, "num_computed_tokens", 500), s.mgr.allocate_slots(s.c, 1))[1],
     InvalidArgumentError, "holds no blocks .* num_computed_tokens=500", "set it to 0"),
    ("num_computed_tokens above the token count (live)", lambda s: (
        setattr(s.a, "num_computed_tokens", 500), s.mgr.allocate_slots(s.a, 1))[1],
     InvalidArgumentError, "500 computed .* more than its 13 tokens", "append the tokens"),
    ("negative num_computed_tokens", lambda s: (
        setattr(s.a, "num_computed_tokens", -3), s.mgr.allocate_slots(s.a, 1))[1],
     InvalidArgumentError, "num_computed_tokens must be an int >= 0, got -3", "whole number"),
    ("allocate_slots(r, 10**9)", lambda s: s.mgr.allocate_slots(s.c, 10**9),
     InvalidArgumentError, "1000000000 new tokens is more than its 15 tokens",
     "append the tokens first"),
    # -- nonsense: types
    ("num_new_tokens 3.5", lambda s: s.mgr.allocate_slots(s.c, 3.5),  # type: ignore[arg-type]
     InvalidArgumentError, "num_new_tokens must be an int >= 0, got 3.5", "whole number"),
    ("num_new_tokens '5'", lambda s: s.mgr.allocate_slots(s.c, "5"),  # type: ignore[arg-type]
     InvalidArgumentError, "num_new_tokens must be an int >= 0, got '5'", "whole number"),
    ("num_new_tokens None", lambda s: s.mgr.allocate_slots(s.a, None),  # type: ignore[arg-type]
     InvalidArgumentError, "num_new_tokens must be an int >= 0, got None", "whole number"),
    ("num_new_tokens True", lambda s: s.mgr.allocate_slots(s.a, True),
     InvalidArgumentError, "num_new_tokens must be an int >= 0, got True", "whole number"),
    ("num_new_tokens 0", lambda s: s.mgr.allocate_slots(s.a, 0),
     InvalidArgumentError, "needs num_new_tokens > 0", "nothing to allocate"),
    ("negative num_new_tokens", lambda s: s.mgr.allocate_slots(s.a, -1),
     InvalidArgumentError, "num_new_tokens must be an int >= 0, got -1", "whole number"),
    ("num_lookahead_tokens '5'", lambda s: s.mgr.allocate_slots(
        s.a, 1, num_lookahead_tokens="5"),  # type: ignore[arg-type]
     InvalidArgumentError, "num_lookahead_tokens must be an int", "whole number"),
    ("negative num_external_computed_tokens", lambda s: s.mgr.allocate_slots(
        s.c, 1, num_external_computed_tokens=-4),
     InvalidArgumentError, "num_external_computed_tokens must be an int >= 0", "whole number"),
    ("num_encoder_tokens 1.5", lambda s: s.mgr.allocate_slots(
        s.a, 1, num_encoder_tokens=1.5),  # type: ignore[arg-type]
     InvalidArgumentError, "num_encoder_tokens must be an int", "whole number"),
    ('allocate_slots("id", 1)', lambda s: s.mgr.allocate_slots("a", 1),  # type: ignore[arg-type]
     InvalidArgumentError, "expected a request object", "new_request"),
    ("allocate_slots(None, 1)", lambda s: s.mgr.allocate_slots(None, 1),  # type: ignore[arg-type]
     InvalidArgumentError, "expected a request object", "new_request"),
    ("get_computed_blocks of an id", lambda s: s.mgr.get_computed_blocks("a"),  # type: ignore[arg-type]
     InvalidArgumentError, "expected a request object", "new_request"),
    ("free(None)", lambda s: s.mgr.free(None),  # type: ignore[arg-type]
     InvalidArgumentError, "expected a request object", "new_request"),
    ("block_hashes longer than the full blocks", lambda s: s.mgr.new_request(
        "h", [1] * 8, block_hashes=[b"x" * 32] * 3),
     InvalidArgumentError, "3 block hashes for 8 tokens", "one hash per full block"),
    ("block_hashes of ints", lambda s: s.mgr.new_request("h", [1] * 8, block_hashes=[1, 2]),  # type: ignore[list-item]
     InvalidArgumentError, "block hash 0 must be bytes", "a digest"),
    ("a str prompt", lambda s: s.mgr.new_request("h", "hello"),
     InvalidArgumentError, "must be a sequence of ints, got str", "sequence of ints"),
    ("cache_salt 5", lambda s: s.mgr.new_request(
        "h", [1], hash_extras=HashExtras(cache_salt=5)),  # type: ignore[arg-type]
     InvalidArgumentError, "cache_salt: expected a str", "a str"),
    ("cache_salt bytes", lambda s: s.mgr.new_request(
        "h", [1], hash_extras=HashExtras(cache_salt=b"s")),  # type: ignore[arg-type]
     InvalidArgumentError, "cache_salt: expected a str", "a str"),
    ("cache_salt a list", lambda s: s.mgr.new_request(
        "h", [1], hash_extras=HashExtras(cache_salt=["s"])),  # type: ignore[arg-type]
     InvalidArgumentError, "cache_salt: expected a str", "a str"),
    ('lora="x"', lambda s: s.mgr.new_request(
        "h", [1], hash_extras=HashExtras(lora="x")),  # type: ignore[arg-type]
     InvalidArgumentError, "lora: expected LoRA", r'LoRA\("sql-adapter", 1\)'),
    ("a multimodal item of the wrong shape", lambda s: s.mgr.new_request(
        "h", [1], hash_extras=HashExtras(mm_items=[("img", -1, 4)])),  # type: ignore[list-item]
     InvalidArgumentError, "mm_items: expected MultiModalItem", "offset >= 0"),
    ("a multimodal item with a negative offset", lambda s: s.mgr.new_request(
        "h", [1], hash_extras=HashExtras(mm_items=[MultiModalItem("img", -1, 4)])),
     InvalidArgumentError, "mm_items: expected MultiModalItem", "offset >= 0"),
    ("prompt_embeds of str", lambda s: s.mgr.new_request(
        "h", [1], hash_extras=HashExtras(prompt_embeds=["e"])),  # type: ignore[list-item]
     InvalidArgumentError, "prompt_embeds: expected bytes", "one token's embedding"),
    ("hash_extras a dict", lambda s: s.mgr.new_request(
        "h", [1], hash_extras={"lora": LoRA("x", 1)}),  # type: ignore[arg-type]
     InvalidArgumentError, "hash_extras must be a HashExtras", "HashExtras"),
    ("token id 2**70", lambda s: s.mgr.new_request("h", [1, 2, 2**70]),
     InvalidArgumentError, "token 2 is 1180591620717411303424", "below 2\\*\\*64"),
    ("a 5-token prompt of floats", lambda s: s.mgr.new_request("h", [1.0, 2.0, 3.0, 4.0, 5.0]),
     InvalidArgumentError, "token 0 is 1.0", "non-negative ints"),
    ("an output token of 2**70", lambda s: s.a.append_output_tokens(2**70),
     InvalidArgumentError, "output token 0 is 1180591620717411303424", "below 2\\*\\*64"),
    # -- other entry points
    ("get_block_ids(None)", lambda s: s.mgr.get_block_ids(None),  # type: ignore[arg-type]
     UnknownRequestError, "unknown request None", "allocate_slots for it first"),
    ("get_block_ids of a freed request", lambda s: s.mgr.get_block_ids("b"),
     UnknownRequestError, "unknown request 'b'", "allocate_slots for it first"),
    ("negative num_running_requests", lambda s: s.mgr.get_num_common_prefix_blocks("a", -1),
     InvalidArgumentError, "num_running_requests must be an int >= 0", "whole number"),
    ("cache_blocks of a request without blocks", lambda s: s.mgr.cache_blocks(s.c, 4),
     UnknownRequestError, "unknown request 'c'", "allocate_slots for it first"),
    ("cache_blocks past the request's slots", lambda s: (
        s.a.append_output_tokens(list(range(10))), s.mgr.cache_blocks(s.a, 23))[1],
     InvalidArgumentError, "cannot register 23 computed tokens, it holds slots for 16",
     "allocate_slots first"),
    ("cache_blocks with a float count", lambda s: s.mgr.cache_blocks(s.a, 4.0),  # type: ignore[arg-type]
     InvalidArgumentError, "num_computed_tokens must be an int", "whole number"),
    ("evict_blocks with an id outside the pool", lambda s: s.mgr.evict_blocks([3, 99]),
     InvalidArgumentError, "block id 99 does not belong", "16 blocks"),
]


@pytest.mark.parametrize(("name", "call", "exc", "problem", "fix"), CASES,
                         ids=[c[0] for c in CASES])
def test_misuse_raises_and_changes_nothing(name: str, call: Call, exc: type[PagedKVError],
                                           problem: str, fix: str) -> None:
    s = scene()
    if isinstance(call, Staged):
        call.prepare(s)
    before = repr(s.mgr.debug_state())
    with pytest.raises(exc) as info:
        call(s)
    message = str(info.value)
    assert type(info.value) is exc, (type(info.value), message)
    assert re.search(problem, message), message
    assert re.search(fix, message), message
    assert repr(s.mgr.debug_state()) == before
    s.mgr.check_invariants()
    # The manager still works: a fresh request's fresh hit is adopted.
    z = s.mgr.new_request("z", PROMPT + [9])
    hit = s.mgr.get_computed_blocks(z)
    assert hit.num_computed_tokens >= 8
    assert s.mgr.allocate_slots(z, z.num_tokens - hit.num_computed_tokens,
                                new_computed_blocks=hit) is not None
    s.mgr.check_invariants()


def test_num_blocks_beyond_host_memory_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"num_blocks=1,000,000,000,000 needs about .* GiB"):
        _manager_with(num_blocks=10**12)


def _manager_with(num_blocks: int) -> KVCacheManager:
    return KVCacheManager(CacheConfig(groups=(FullAttentionSpec(block_size=BS, **HEADS),),
                                      num_blocks=num_blocks, max_model_len=32))


@pytest.mark.parametrize("bad", [1, 0, -5, 2.5, True, "100"])
def test_bad_num_blocks_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="num_blocks must be an int >= 2"):
        _manager_with(bad)


def test_forged_null_blocks_in_a_window_hit_are_refused() -> None:
    """A sliding-window hit whose nulls cover blocks the next token reads."""
    mgr = KVCacheManager(CacheConfig(
        groups=(FullAttentionSpec(block_size=BS, **HEADS),
                SlidingWindowSpec(block_size=BS, sliding_window=8, **HEADS)),
        num_blocks=32, max_model_len=64))
    a = mgr.new_request("a", list(range(17)))
    assert mgr.allocate_slots(a, 17) is not None
    a.num_computed_tokens = 17
    c = mgr.new_request("c", list(range(17)) + [5])
    hit = mgr.get_computed_blocks(c)
    assert hit.num_computed_tokens == 16 and hit.block_ids[1][:2] == [0, 0]
    full, window = hit.block_ids
    bad = hit._replace(block_ids=(full, [0, 0, 0, window[3]]))
    before = repr(mgr.debug_state())
    with pytest.raises(InvalidHitError, match="3 leading null blocks, but the next token "
                                              "reads the KV of block 2"):
        mgr.allocate_slots(c, 2, new_computed_blocks=bad)
    swapped = hit._replace(block_ids=(window[:2] + [full[2], full[3]], full))
    with pytest.raises(InvalidHitError):
        mgr.allocate_slots(c, 2, new_computed_blocks=swapped)
    assert repr(mgr.debug_state()) == before
    assert mgr.allocate_slots(c, 2, new_computed_blocks=hit) is not None
    mgr.check_invariants()


def test_preempted_request_with_computed_reset_allocates_again() -> None:
    """The legitimate re-admission: freed, ``num_computed_tokens`` back to 0."""
    s = scene()
    s.mgr.free(s.a)
    s.a.num_computed_tokens = 0
    s.a.num_preemptions += 1
    hit = s.mgr.get_computed_blocks(s.a)
    assert s.mgr.allocate_slots(s.a, s.a.num_tokens - hit.num_computed_tokens,
                                new_computed_blocks=hit) is not None
    s.mgr.check_invariants()


def test_freed_id_is_free_again() -> None:
    s = scene()
    s.mgr.free("a")
    fresh = s.mgr.new_request("a", [1, 2, 3])
    assert s.mgr.allocate_slots(fresh, 3) is not None
    s.mgr.check_invariants()
