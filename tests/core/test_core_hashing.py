"""Block hashing: the acceptance vectors, canonical CBOR, extra keys, stability."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv import (
    BlockHasher,
    HashExtras,
    InvalidArgumentError,
    LoRA,
    MissingDependencyError,
    MultiModalItem,
    Request,
)
from pagedkv.core.hashing import canonical_cbor

SEED = "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
H1234 = "58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111"
H5678 = "e1bc29393a2da9fd798f35ff04d215f846aee6df4b803ce3d43b57df56b58fb1"
H1234_SALT = "6b34eefae052446391748e3de039648a84a16ca73963c333b538b6b0f92cc3f8"


def test_acceptance_vectors() -> None:
    h = BlockHasher(4)
    assert h.seed.hex() == SEED
    first = h.hash_block(h.seed, [1, 2, 3, 4])
    assert first.hex() == H1234
    assert h.hash_block(first, [5, 6, 7, 8]).hex() == H5678
    assert h.hash_block(h.seed, [1, 2, 3, 4], [["cache_salt", "s1"]]).hex() == H1234_SALT


def test_request_hashes_incrementally_and_matches_vectors() -> None:
    h = BlockHasher(4)
    req = Request("r", [1, 2, 3, 4, 5, 6], hasher=h)
    assert [x.hex() for x in req.block_hashes] == [H1234]
    req.append_output_tokens(7)
    assert len(req.block_hashes) == 1
    req.append_output_tokens([8, 9])
    assert [x.hex() for x in req.block_hashes] == [H1234, H5678]
    salted = Request("s", [1, 2, 3, 4, 5, 6, 7, 8], hasher=h,
                     hash_extras=HashExtras(cache_salt="s1"))
    assert salted.block_hashes[0].hex() == H1234_SALT
    # The salt applies to the first block only, but the chain carries it on.
    assert salted.block_hashes[1] != req.block_hashes[1]


def test_caller_supplied_hashes_are_kept_and_the_chain_continues() -> None:
    h = BlockHasher(4)
    given_hashes = [b"\x01" * 32]
    req = Request("r", [0] * 6, hasher=h, block_hashes=given_hashes)
    assert req.block_hashes == given_hashes
    req.append_output_tokens([5, 6])
    assert req.block_hashes[1] == h.hash_block(given_hashes[0], [0, 0, 5, 6])


def test_digest_does_not_depend_on_process_or_hash_seed() -> None:
    code = (
        "from pagedkv import BlockHasher; h = BlockHasher(4);"
        "print(h.hash_block(h.seed, [1, 2, 3, 4], [['lora', 'x'], ['mm', 'img', -2]]).hex())"
    )
    outs = set()
    for seed in ("0", "1", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                capture_output=True, text=True).stdout)
    assert len(outs) == 1


def test_secret_seed_changes_every_hash() -> None:
    plain = BlockHasher(4)
    secret = BlockHasher(4, secret_seed=b"deployment-secret")
    assert secret.seed != plain.seed
    assert secret.hash_block(secret.seed, [1, 2, 3, 4]) != plain.hash_block(plain.seed,
                                                                            [1, 2, 3, 4])


def test_extra_keys_separate_otherwise_equal_blocks() -> None:
    h = BlockHasher(4)
    tokens = [0] * 8
    plain = Request("a", tokens, hasher=h).block_hashes
    lora = Request("b", tokens, hasher=h,
                   hash_extras=HashExtras(lora=LoRA("x", 1))).block_hashes
    embeds_1 = Request("c", tokens, hasher=h,
                       hash_extras=HashExtras(prompt_embeds=[b"e1"] * 8)).block_hashes
    embeds_2 = Request("d", tokens, hasher=h,
                       hash_extras=HashExtras(prompt_embeds=[b"e2"] * 8)).block_hashes
    assert len({plain[0], lora[0], embeds_1[0], embeds_2[0]}) == 4


def test_xxhash_option() -> None:
    pytest.importorskip("xxhash")
    h = BlockHasher(4, algo="xxhash_cbor")
    assert len(h.seed) == 16
    assert h.hash_block(h.seed, [1, 2, 3, 4]) != h.hash_block(h.seed, [1, 2, 3, 5])


def test_xxhash_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xxhash", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'pagedkv\[fast\]'"):
        BlockHasher(4, algo="xxhash_cbor")


def test_bad_inputs() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown hash algorithm"):
        BlockHasher(4, algo="md5")
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        BlockHasher(2).hash_block(b"", [1, -1])
    with pytest.raises(InvalidArgumentError, match="cannot CBOR-encode"):
        canonical_cbor(object())


cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.text(max_size=5)
    | st.binary(max_size=5) | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=12,
)


@given(cbor_values)
def test_canonical_cbor_matches_cbor2(value: object) -> None:
    cbor2 = pytest.importorskip("cbor2")
    assert canonical_cbor(value) == cbor2.dumps(value, canonical=True)


@given(st.lists(st.integers(0, 2**20), min_size=4, max_size=4))
def test_token_fast_path_matches_generic_encoding(tokens: list[int]) -> None:
    h = BlockHasher(4)
    import hashlib

    expected = hashlib.sha256(canonical_cbor([h.seed, tokens, None])).digest()
    assert h.hash_block(h.seed, tokens) == expected


@given(st.lists(st.integers(0, 2**33), min_size=0, max_size=160), st.integers(1, 17))
def test_incremental_hashing_equals_block_by_block(tokens: list[int], block_size: int) -> None:
    """The fast path (table encoding, large ids falling back) equals hashing each full block
    on its own, and never hashes a partial block."""
    h = BlockHasher(block_size)
    got: list[bytes] = []
    h.extend(got, tokens)
    expected: list[bytes] = []
    parent = h.seed
    for s in range(0, len(tokens) - block_size + 1, block_size):
        parent = h.hash_block(parent, tokens[s : s + block_size])
        expected.append(parent)
    assert got == expected


def test_negative_token_in_a_prompt_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        Request("r", [1, 2, 3, -4], hasher=BlockHasher(2))


@given(st.lists(st.lists(st.integers(0, 300), min_size=0, max_size=12), max_size=6),
       st.integers(0, 3))
def test_memo_never_changes_a_digest(prompts: list[list[int]], memo_blocks: int) -> None:
    """Hashing with a tiny memo (rotating often) or none equals hashing without a memo."""
    plain = BlockHasher(2, memo_blocks=0)
    memo = BlockHasher(2, memo_blocks=memo_blocks)
    for tokens in prompts + prompts:
        a: list[bytes] = []
        b: list[bytes] = []
        plain.extend(a, tokens)
        memo.extend(b, tokens)
        assert a == b


def test_a_hasher_shared_by_threads_gives_the_same_digests() -> None:
    import random
    import threading

    shared = BlockHasher(4, memo_blocks=8)  # a tiny memo: generations swap constantly
    reference = BlockHasher(4, memo_blocks=0)
    rng = random.Random(3)
    prompts = [[rng.randrange(40) for _ in range(rng.randrange(4, 60))] for _ in range(200)]
    expected = []
    for p in prompts:
        hs: list[bytes] = []
        reference.extend(hs, p)
        expected.append(hs)
    errors: list[int] = []

    def work(offset: int) -> None:
        for i in range(len(prompts)):
            j = (i + offset) % len(prompts)
            got: list[bytes] = []
            shared.extend(got, prompts[j])
            if got != expected[j]:
                errors.append(j)

    threads = [threading.Thread(target=work, args=(k * 37,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@st.composite
def _tokens_and_extras(draw: st.DrawFn) -> tuple[list[int], HashExtras]:
    """Up to 160 token ids (short inputs and the array encoding) and extras: LoRA, salt,
    multimodal items, per-token embeddings."""
    top = draw(st.sampled_from([300, 65535, 2**18]))  # ids < 256 encode shorter
    n = draw(st.integers(0, 160))
    tokens = draw(st.lists(st.integers(0, top), min_size=n, max_size=n))
    mm = draw(st.lists(st.tuples(st.integers(0, 150), st.integers(1, 20)), max_size=3))
    extras = HashExtras(
        lora=draw(st.sampled_from([None, LoRA("a", 1, "/p"), LoRA("a", 1, "/q"), LoRA("b", 2)])),
        cache_salt=draw(st.sampled_from([None, "", "tenant"])),
        mm_items=[MultiModalItem(f"img-{k}", off, n) for k, (off, n) in enumerate(mm)],
        prompt_embeds=[bytes([i % 251]) for i in range(len(tokens))]
        if draw(st.booleans()) else None,
    )
    return tokens, extras


@given(_tokens_and_extras(), st.integers(1, 17), st.sampled_from([0, 3, 64]),
       st.integers(0, 160))
def test_hashing_with_extras_equals_block_by_block(
    case: tuple[list[int], HashExtras], block_size: int, memo_blocks: int, cut: int
) -> None:
    """With extras (LoRA, salt, multimodal items, embeddings), incremental hashing in two
    calls, with or without a memo (each prompt hashed twice so the memo is hit), equals
    hashing each full block on its own with its own keys, and records those keys."""
    tokens, extras = case
    h = BlockHasher(block_size, memo_blocks=memo_blocks)
    expected: list[bytes] = []
    expected_keys: list[object] = []
    parent = h.seed
    for s in range(0, len(tokens) - block_size + 1, block_size):
        keys = extras.block_keys(s, s + block_size)
        parent = h.hash_block(parent, tokens[s : s + block_size], keys)
        expected.append(parent)
        expected_keys.append(keys)
    for _ in range(2):
        got: list[bytes] = []
        got_keys: list[object] = []
        h.extend(got, tokens[:cut], extras, got_keys)
        h.extend(got, tokens, extras, got_keys)
        assert got == expected
        assert got_keys == expected_keys


@given(st.lists(st.integers(256, 65535), max_size=300), st.integers(1, 17),
       st.lists(st.tuples(st.integers(0, 299), st.sampled_from([0, 5, 255, 65536, 2**20])),
                max_size=3))
def test_packed_token_encoding_equals_block_by_block(
    tokens: list[int], block_size: int, edits: list[tuple[int, int]]
) -> None:
    """Prompts of 3-byte ids (the packed and array encodings), with a few ids that encode
    otherwise planted, hash as each block hashed on its own."""
    for i, t in edits:
        if i < len(tokens):
            tokens[i] = t
    h = BlockHasher(block_size, memo_blocks=0)
    expected: list[bytes] = []
    parent = h.seed
    for s in range(0, len(tokens) - block_size + 1, block_size):
        parent = h.hash_block(parent, tokens[s : s + block_size])
        expected.append(parent)
    got: list[bytes] = []
    h.extend(got, tokens)
    assert got == expected


@pytest.mark.parametrize("extras", [None, HashExtras(lora=LoRA("a", 1, "/p"), cache_salt="s")])
def test_a_supplied_parent_of_another_length_chains_like_hash_block(
    extras: HashExtras | None,
) -> None:
    """A caller-supplied last hash shorter than a digest heads only its own child's
    input; every later block's parent is a 32-byte digest."""
    h = BlockHasher(4, memo_blocks=0)
    tokens = list(range(1, 17))
    got = [b"x" * 16]
    h.extend(got, tokens, extras)
    parent, expected = b"x" * 16, [b"x" * 16]
    for s in range(4, 16, 4):
        keys = None if extras is None else extras.block_keys(s, s + 4)
        parent = h.hash_block(parent, tokens[s : s + 4], keys)
        expected.append(parent)
    assert got == expected
