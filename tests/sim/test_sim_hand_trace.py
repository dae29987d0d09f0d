"""Tiny hand-written JSONL traces whose hits, evictions and preemptions are worked out
below, block by block. Block size 4 and ``source_block_size=4``: one hash id per block.
Free-queue rules used (SPEC 3.2): a request frees its blocks tail first; hashed blocks go
to the back, unhashed (partial) ones to the front; allocation pops the front."""

from __future__ import annotations

import json
from pathlib import Path

from pagedkv.sim import EngineSimulator, SchedulerConfig, load_trace, run_pure_cache
from pagedkv.sim.bounds import access_sequence, belady_hits, infinite_cache_hits


def _write(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    path.write_text("".join(
        json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": ids})
        + "\n"
        for t, n, o, ids in rows
    ))
    return path


def test_pure_cache_hits_and_evictions(tmp_path: Path) -> None:
    # 3 usable blocks (num_blocks=4), initial free queue [1, 2, 3].
    # r0: 9 tokens, ids 1 2 3 -> full blocks h1 h2 (+1 token in a partial block).
    #     lookup: miss. allocate 9 tokens -> blocks 1(h1) 2(h2) 3(partial).
    #     free tail first: 3 unhashed -> front; 2, 1 -> back. queue [3, 2, 1].
    # r1: 9 tokens, ids 1 2 4 -> h1 h2 hit: 8 tokens (the cap (9-1)//4 = 2 blocks allows it).
    #     needs 1 new block: pops 3 (no hash: no eviction). queue again [3, 2, 1].
    # r2: 12 tokens, ids 5 6 7 -> miss; 3 full blocks: pops 3, 2, 1 -> evicts h2, h1 (2).
    #     its table is [3(h5), 2(h6), 1(h7)]; freed tail first -> queue [1, 2, 3].
    # r3: 9 tokens, ids 1 2 3 -> miss (h1 h2 evicted); 3 blocks: pops 1, 2, 3 -> evicts
    #     h7, h6, h5 (3 more). Total: hits [0, 8, 0, 0], evictions 5.
    trace = _write(tmp_path / "t.jsonl", [
        (0, 9, 1, [1, 2, 3]), (1, 9, 1, [1, 2, 4]), (2, 12, 1, [5, 6, 7]), (3, 9, 1, [1, 2, 3]),
    ])
    wl = load_trace(trace, source_block_size=4)
    res = run_pure_cache(wl, block_size=4, num_blocks=4, check_invariants=True)
    assert res.hit_tokens == [0, 8, 0, 0]
    assert res.evicted_blocks == 5
    assert res.hit_rate() == 8 / 39

    # Bounds on the same sequence: queried blocks r0 (h1 h2), r1 (h1 h2), r2 (h5 h6; h7 is
    # stored only: (12-1)//4 = 2), r3 (h1 h2). Infinite: r1 and r3 hit 8 each. Belady with
    # 3 blocks keeps h1 h2 throughout (next used by r1, then r3) and bypasses h5 h6 h7 (never
    # queried again): also 16 -- twice what LRU got.
    seq = access_sequence(wl, 4)
    assert infinite_cache_hits(seq).hit_tokens == [0, 8, 0, 8]
    assert belady_hits(seq, 3).hit_tokens == [0, 8, 0, 8]
    assert belady_hits(seq, 1).hit_tokens == [0, 4, 0, 4]  # one block: keep h1


def test_engine_preemption_evictions_and_relookup(tmp_path: Path) -> None:
    # 4 usable blocks (num_blocks=5), queue [1, 2, 3, 4]; A and B arrive at 0, C at 1 s.
    # Decode tokens are placeholders unique per request.
    # step 1: A (8 tokens, ids 1 2) allocates 1 2; B (ids 3 4) allocates 3 4; both
    #         prefills complete -> first tokens; A and B hold 9 tokens each. Queue empty.
    # step 2: A decodes token 9: needs a 3rd block, none free -> preempt the newest, B
    #         (freed tail first: queue [4, 3], both hashed). A takes 4: evicts h4 (1).
    #         No admission in a step that preempted.
    # step 3: B re-looks up: h3 is cached (block 3, free), h4 is not -> hit 4 tokens; it
    #         needs 3 blocks (revive 3 + 2 new) but only 1 is free: it waits.
    # steps 4-5: A decodes; at step 5 its 3rd block fills and is registered. A has its 5
    #         output tokens and finishes: freed [4, 2, 1] -> queue [3, 4, 2, 1].
    # step 6: B admitted (preempted re-lookup: 9 tokens queried, 4 hit): revives 3, pops 4
    #         (evicts A's decode block, 2) and 2 (evicts h2, 3). B then decodes to the end
    #         and frees [2, 4, 3]; queue [1, 2, 4, 3].
    # C at 1 s (8 tokens, ids 1 2): h1 hits; the cap (8-1)//4 = 1 block stops there -> 4
    #         tokens. It needs 2 blocks (revive 1, pop 2: evicts B's decode block, 4).
    #         One output token: done after its prefill.
    # Totals: fresh hits [0, 0, 4]; 1 preemption; 4 evictions; re-lookup 4 of 9 tokens.
    trace = _write(tmp_path / "t.jsonl", [
        (0, 8, 5, [1, 2]), (0, 8, 5, [3, 4]), (1000, 8, 1, [1, 2]),
    ])
    wl = load_trace(trace, source_block_size=4)
    cfg = SchedulerConfig(token_budget=100, max_running=10, check_invariants_every_step=True)
    res = EngineSimulator(wl, block_size=4, num_blocks=5, config=cfg).run()
    assert res.hit_tokens == [0, 0, 4]
    assert res.preemptions == 1
    assert res.evicted_blocks == 4
    assert (res.preempted_query_tokens, res.preempted_hit_tokens) == (9, 4)
    assert all(t is not None for t in res.finish_s)
    # A finished at step 5, B was first scheduled at step 1 and finished after A.
    assert res.first_token_s[0] == res.first_token_s[1]  # both prefilled in step 1
    a_done, b_done = res.finish_s[0], res.finish_s[1]
    assert a_done is not None and b_done is not None and b_done > a_done
    assert res.arrival_s[2] == 1.0 and res.first_scheduled_s[2] == 1.0
