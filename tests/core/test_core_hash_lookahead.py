"""Hash lookahead (``CacheConfig.num_hash_lookahead_tokens``): hashes, caching, events."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pagedkv
from pagedkv import BlockHasher, HashExtras, InvalidArgumentError, LoRA, MultiModalItem
from pagedkv.core.hashing import canonical_cbor
from pagedkv.core.hashing_lookahead import LookaheadBlockHasher, prefill_checkpoint_position
from pagedkv.events import BlockStored
from pagedkv.events.wire import decode_batch, encode_batch

TOKENS = list(range(100, 118))  # 18 tokens: 4 full blocks of 4


def _manager(lookahead: int, *, block_size: int = 4, events: bool = True) -> pagedkv.KVCacheManager:
    spec = pagedkv.FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=16,
                                     dtype_bytes=2)
    return pagedkv.KVCacheManager(pagedkv.CacheConfig(
        groups=(spec,), num_blocks=32, max_model_len=256, enable_events=events,
        num_hash_lookahead_tokens=lookahead))


def _admit(mgr: pagedkv.KVCacheManager, rid: str, tokens: list[int],
           extras: HashExtras | None = None) -> tuple[pagedkv.Request, int]:
    req = mgr.new_request(rid, tokens, hash_extras=extras)
    hit = mgr.get_computed_blocks(req)
    mgr.check_invariants()
    n = req.num_tokens - hit.num_computed_tokens
    assert mgr.allocate_slots(req, n, new_computed_blocks=hit) is not None
    req.num_computed_tokens = req.num_tokens
    mgr.check_invariants()
    return req, hit.num_computed_tokens


def test_hash_input_is_block_tokens_then_extra_keys_and_lookahead_tokens() -> None:
    h = LookaheadBlockHasher(4, lookahead_tokens=1)
    out: list[bytes] = []
    h.extend(out, [1, 2, 3, 4])
    assert out == []  # block [0, 4) waits for token 4
    h.extend(out, [1, 2, 3, 4, 5])
    seed = hashlib.sha256(canonical_cbor("vllm-none-hash")).digest()
    expected = hashlib.sha256(canonical_cbor([seed, [1, 2, 3, 4], [None, 5]])).digest()
    assert out == [expected]
    # Not the plain hash of the block, and the next block also needs its lookahead.
    assert out[0] != BlockHasher(4).hash_block(seed, [1, 2, 3, 4])
    h.extend(out, [1, 2, 3, 4, 5, 6, 7, 8])
    assert len(out) == 1


def test_extra_keys_cover_the_lookahead_window_and_are_recorded() -> None:
    extras = HashExtras(lora=LoRA("sql", 1, "/a"), cache_salt="t",
                        mm_items=(MultiModalItem("img", 5, 2),))
    h = LookaheadBlockHasher(4, lookahead_tokens=2)
    out: list[bytes] = []
    keys: list[list[Any] | None] = []
    h.extend(out, list(range(10)), extras=extras, keys_out=keys)
    # Block [0, 4) sees tokens up to 6: the image at 5 counts (offset 5 - 0).
    e0 = [["lora", "sql", "/a"], ["mm", "img", 5], ["cache_salt", "t"]]
    e1 = [["lora", "sql", "/a"], ["mm", "img", 1]]
    assert keys == [e0, e1]
    assert out[0] == h.hash_block(h.seed, [0, 1, 2, 3], [e0, 4, 5])
    assert out[1] == h.hash_block(out[0], [4, 5, 6, 7], [e1, 8, 9])


@st.composite
def _ahead_case(draw: st.DrawFn) -> tuple[list[int], HashExtras | None]:
    """Up to 120 token ids (ids below 256, uint16 only, and past the token table) and
    extras."""
    low, top = draw(st.sampled_from([(0, 300), (256, 65535), (0, 65535), (0, 2**18)]))
    n = draw(st.integers(0, 120))
    tokens = draw(st.lists(st.integers(low, top), min_size=n, max_size=n))
    if not draw(st.booleans()):
        return tokens, None
    mm = draw(st.lists(st.tuples(st.integers(0, 110), st.integers(1, 12)), max_size=2))
    return tokens, HashExtras(
        lora=draw(st.sampled_from([None, LoRA("a", 1, "/p"), LoRA("b", 2)])),
        cache_salt=draw(st.sampled_from([None, "", "tenant"])),
        mm_items=[MultiModalItem(f"img-{k}", off, n) for k, (off, n) in enumerate(mm)],
    )


@given(_ahead_case(), st.integers(1, 9), st.integers(1, 4), st.sampled_from([0, 3, 64]),
       st.integers(0, 120))
def test_lookahead_hashing_equals_block_by_block(
    case: tuple[list[int], HashExtras | None], block_size: int, lookahead: int,
    memo_blocks: int, cut: int,
) -> None:
    """Incremental hashing in two calls, with or without a memo (each prompt hashed twice
    so the memo is hit), equals hashing each block on its own with ``[E, lookahead
    tokens]`` as its extra keys, and records each block's ``E``."""
    tokens, extras = case
    h = LookaheadBlockHasher(block_size, lookahead_tokens=lookahead, memo_blocks=memo_blocks)
    expected: list[bytes] = []
    expected_keys: list[object] = []
    parent = h.seed
    for s in range(0, len(tokens) - block_size - lookahead + 1, block_size):
        e = s + block_size
        keys = None if extras is None else extras.block_keys(s, e + lookahead)
        parent = h.hash_block(parent, tokens[s:e], [keys, *tokens[e : e + lookahead]])
        expected.append(parent)
        expected_keys.append(keys)
    for _ in range(2):
        got: list[bytes] = []
        got_keys: list[object] = []
        h.extend(got, tokens[:cut], extras, got_keys)
        h.extend(got, tokens, extras, got_keys)
        assert got == expected
        assert got_keys == (expected_keys if extras is not None else [])


def test_bad_lookahead_is_refused() -> None:
    spec = pagedkv.FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype_bytes=2)
    bads: tuple[Any, ...] = (-1, 1.5, True)
    for bad in bads:
        with pytest.raises(InvalidArgumentError, match="num_hash_lookahead_tokens"):
            pagedkv.CacheConfig(groups=(spec,), num_blocks=8, max_model_len=64,
                                num_hash_lookahead_tokens=bad)
    with pytest.raises(InvalidArgumentError, match="lookahead_tokens"):
        LookaheadBlockHasher(4, lookahead_tokens=0)


def test_off_by_default_uses_the_plain_hasher() -> None:
    assert type(_manager(0).hasher) is BlockHasher
    assert type(_manager(3).hasher) is LookaheadBlockHasher


def test_blocks_are_cached_only_once_their_lookahead_is_known() -> None:
    mgr = _manager(4)
    a, hit = _admit(mgr, "a", TOKENS)
    assert hit == 0
    # 18 tokens, L = 4: blocks end at 4, 8, 12 have their 4 next tokens; the one ending
    # at 16 would need token 19.
    assert len(a.block_hashes) == 3
    (stored,) = [e for e in mgr.take_events() if isinstance(e, BlockStored)]
    assert stored.token_ids == TOKENS[:12]
    assert stored.lookahead_token_ids == [TOKENS[4:8], TOKENS[8:12], TOKENS[12:16]]
    # Same first 13 tokens, then different: block [8, 12)'s hash covers tokens 12..15,
    # so only the first two blocks hit.
    other = TOKENS[:13] + [1, 2, 3, 4, 5]
    b, hit = _admit(mgr, "b", other)
    assert hit == 8
    # The same prompt hits all three hashed blocks (capped below the last token).
    c, hit = _admit(mgr, "c", list(TOKENS))
    assert hit == 12
    # Decoding one token at a time: block [12, 16) is hashed (and cached) at token 20.
    a.append_output_tokens(200)
    assert len(a.block_hashes) == 3
    a.append_output_tokens(201)
    assert len(a.block_hashes) == 4
    assert mgr.allocate_slots(a, 2) is not None
    a.num_computed_tokens = a.num_tokens
    mgr.check_invariants()
    stored = [e for e in mgr.take_events() if isinstance(e, BlockStored)][-1]
    assert stored.block_hashes == [a.block_hashes[3]]
    assert stored.lookahead_token_ids == [TOKENS[16:18] + [200, 201]]
    # The index snapshot keeps each block's lookahead tokens.
    snap = {e.block_hashes[0]: e.lookahead_token_ids for e in mgr.prefix_index_snapshot()}
    assert snap[a.block_hashes[0]] == [TOKENS[4:8]]
    assert snap[a.block_hashes[3]] == [TOKENS[16:18] + [200, 201]]


def test_event_wire_form_carries_lookahead_only_when_set() -> None:
    plain = BlockStored([b"\x01" * 8], None, [1, 2], 2, None, "GPU", None, None, 0)
    ahead = plain._replace(lookahead_token_ids=[[3, 4]])
    p_plain = encode_batch([plain], timestamp_s=0.0)
    p_ahead = encode_batch([ahead], timestamp_s=0.0)
    assert b"lookahead_token_ids" not in p_plain
    assert p_ahead.endswith(b"\xb3lookahead_token_ids\x91\x92\x03\x04\x00")
    assert decode_batch(p_ahead).events == [ahead]
    assert decode_batch(p_plain).events == [plain]


def test_prefill_checkpoint_position_worked_values() -> None:
    # (tokens, hash block, L) -> boundary: leaves max(1, L) tokens after it.
    assert prefill_checkpoint_position(33, 16, 0) == 32
    assert prefill_checkpoint_position(32, 16, 0) == 16
    assert prefill_checkpoint_position(35, 16, 3) == 32
    assert prefill_checkpoint_position(34, 16, 3) == 16
    assert prefill_checkpoint_position(10, 16, 4) == 0


def test_mamba_keeps_the_prompt_state_at_the_lookahead_boundary() -> None:
    # Full 16 + Mamba 16 with 4-token hash blocks and L = 4: a 35-token prompt's reusable
    # state is at prefill_checkpoint_position(35, 4, 4) = 28 (not 32 as with L = 0: the
    # hash of the block ending at 32 needs token 35, which a 35-token prompt lacks).
    common: dict[str, Any] = dict(block_size=16, num_kv_heads=2, head_size=16, dtype_bytes=2)
    mgr = pagedkv.KVCacheManager(pagedkv.CacheConfig(
        groups=(pagedkv.FullAttentionSpec(**common),
                pagedkv.MambaSpec(block_size=16, state_bytes=256)),
        num_blocks=32, max_model_len=256, hash_block_size=4, num_hash_lookahead_tokens=4))
    prompt = list(range(500, 535))
    a = mgr.new_request("a", prompt)
    assert len(a.block_hashes) == 7  # blocks ending at 4 .. 28
    hit = mgr.get_computed_blocks(a)
    assert hit.num_computed_tokens == 0
    mgr.new_step_starts()
    assert mgr.allocate_slots(a, 28, new_computed_blocks=hit) is not None  # chunk to 28
    a.num_computed_tokens = 28
    mgr.check_invariants()
    mgr.new_step_starts()
    assert mgr.allocate_slots(a, 7) is not None  # the rest of the prompt
    a.num_computed_tokens = 35
    mgr.check_invariants()
    mgr.new_step_starts()
    b = mgr.new_request("b", prompt)
    assert mgr.get_computed_blocks(b).num_computed_tokens == 28
    mgr.check_invariants()
