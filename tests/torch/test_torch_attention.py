"""Reference paged attention against dense attention, masks, sinks, NaN isolation, and
the state mixer's table coupling."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pagedkv.torch import (
    AttentionMask,
    CausalMask,
    ChunkedLocalMask,
    SlidingWindowMask,
    build_batch_tables,
    checkpoint_state_io,
    paged_attention,
    paged_latent_attention,
    write_kv,
    write_latent,
)

BS, HQ, HKV, D, CONTEXT = 4, 4, 2, 8, 32


def _setup(seed: int = 0):  # type: ignore[no-untyped-def]
    """Two sequences (11 and 6 tokens) at scattered blocks of a NaN-filled cache; the step
    computes their last 4 and 6 tokens. Returns cache, tables, dense K/V per sequence and
    the step's queries."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.full((20, 2, BS, HKV, D), math.nan)
    lengths, new = [11, 6], [4, 6]
    tables = [([13, 2, 17],), ([5, 9],)]
    dense = [(torch.randn(n, HKV, D, generator=gen), torch.randn(n, HKV, D, generator=gen))
             for n in lengths]
    # the cached prefix: written as an earlier step would have
    old = build_batch_tables(tables[:1], [0], [7], block_sizes=[BS], num_table_blocks=[8])
    assert old.slot_mappings[0] is not None
    write_kv(cache, old.slot_mappings[0], dense[0][0][:7], dense[0][1][:7])
    step = build_batch_tables(tables, [7, 0], new, block_sizes=[BS], num_table_blocks=[8])
    assert step.slot_mappings[0] is not None
    write_kv(cache, step.slot_mappings[0], torch.cat([dense[0][0][7:], dense[1][0]]),
             torch.cat([dense[0][1][7:], dense[1][1]]))
    query = torch.randn(sum(new), HQ, D, generator=gen)
    return cache, step, dense, query


def _dense_reference(dense, step, query, mask: AttentionMask):  # type: ignore[no-untyped-def]
    outs = []
    for t in range(step.num_tokens):
        r, pos = int(step.token_to_request[t]), int(step.positions[t])
        k, v = dense[r]
        keys = torch.arange(k.shape[0])
        visible = mask.visible(torch.tensor([pos]), keys)[0]
        kk = k.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)  # [HQ, n, D]
        vv = v.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)
        out = F.scaled_dot_product_attention(query[t][:, None, :], kk, vv,
                                             attn_mask=visible[None, None, :], scale=D**-0.5)
        outs.append(out[:, 0, :])
    return torch.stack(outs)


@pytest.mark.parametrize("mask", [CausalMask(), SlidingWindowMask(3), ChunkedLocalMask(8)],
                         ids=["causal", "sliding", "chunked"])
def test_paged_attention_matches_dense_attention(mask: AttentionMask) -> None:
    cache, step, dense, query = _setup()
    out = paged_attention(query, cache, step, 0, mask, context_len=CONTEXT, scale=D**-0.5)
    assert not out.isnan().any()  # NaN pages (unwritten, null, padding) never leak
    torch.testing.assert_close(out, _dense_reference(dense, step, query, mask))


def test_a_wrong_block_id_changes_the_result() -> None:
    cache, step, dense, query = _setup()
    good = paged_attention(query, cache, step, 0, CausalMask(), context_len=CONTEXT, scale=1.0)
    step.block_tables[0][0, 0] = 5  # swap one id of sequence 0 for a block of sequence 1
    bad = paged_attention(query, cache, step, 0, CausalMask(), context_len=CONTEXT, scale=1.0)
    assert not torch.equal(good[:4], bad[:4]) and torch.equal(good[4:], bad[4:])


def test_sinks_take_probability_mass_only() -> None:
    cache, step, dense, query = _setup()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out = paged_attention(query, cache, step, 0, CausalMask(), context_len=CONTEXT,
                          scale=D**-0.5, sinks=sinks)
    t, r, pos = 0, 0, 7  # first new token of sequence 0
    k, v = (x[: pos + 1].repeat_interleave(2, dim=1) for x in dense[r])
    scores = torch.einsum("hd,nhd->hn", query[t], k) * D**-0.5
    probs = torch.softmax(torch.cat([scores, sinks[:, None]], 1), 1)[:, :-1]
    torch.testing.assert_close(out[t], torch.einsum("hn,nhd->hd", probs, v))


def test_latent_attention_is_attention_with_keys_equal_to_values() -> None:
    gen = torch.Generator().manual_seed(1)
    cache = torch.full((10, BS, 16), math.nan)
    step = build_batch_tables([([3, 7, 1],)], [0], [10], block_sizes=[BS], num_table_blocks=[8])
    latent = torch.randn(10, 16, generator=gen)
    assert step.slot_mappings[0] is not None
    write_latent(cache, step.slot_mappings[0], latent)
    q = torch.randn(10, HQ, 16, generator=gen)
    out = paged_latent_attention(q, cache, step, 0, CausalMask(), context_len=CONTEXT,
                                 scale=0.25)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(q.transpose(0, 1), latent[None], latent[None],
                                         attn_mask=causal, scale=0.25).transpose(0, 1)
    torch.testing.assert_close(out, ref)


def test_masks_worked_cases() -> None:
    keys = torch.arange(12)
    q = torch.tensor([9])
    assert keys[SlidingWindowMask(4).visible(q, keys)[0]].tolist() == [6, 7, 8, 9]
    assert keys[ChunkedLocalMask(8).visible(q, keys)[0]].tolist() == [8, 9]
    assert keys[CausalMask().visible(q, keys)[0]].tolist() == list(range(10))


def test_checkpoint_state_io_worked_cases() -> None:
    assert checkpoint_state_io(0, 20, 8) == (None, [(8, 0), (16, 1), (20, 2)])
    assert checkpoint_state_io(16, 1, 8) == (1, [(1, 2)])
    assert checkpoint_state_io(13, 3, 8) == (1, [(3, 1)])
    assert checkpoint_state_io(8, 8, 8) == (0, [(8, 1)])
