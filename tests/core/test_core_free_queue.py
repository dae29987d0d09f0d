"""The free queue against a plain list, under random operation sequences."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pagedkv.core.free_queue import FreeBlockQueue

ops = st.lists(
    st.tuples(st.sampled_from(["pop", "popn", "remove", "append", "appendn", "prependn"]),
              st.integers(0, 1000), st.integers(0, 4)),
    max_size=60,
)


@given(st.integers(2, 20), ops)
def test_free_queue_matches_a_list(num_blocks: int, program: list[tuple[str, int, int]]) -> None:
    q = FreeBlockQueue(num_blocks)
    model = list(range(1, num_blocks))
    out: list[int] = []  # ids currently outside the queue
    for op, x, n in program:
        if op == "pop" and model:
            b = q.popleft()
            assert b == model.pop(0)
            out.append(b)
        elif op == "popn":
            k = min(n, len(model))
            got = q.popleft_n(k)
            assert got == model[:k]
            del model[:k]
            out.extend(got)
        elif op == "remove" and model:
            b = model.pop(x % len(model))
            q.remove(b)
            out.append(b)
        elif op == "append" and out:
            b = out.pop(x % len(out))
            q.append(b)
            model.append(b)
        elif op in ("appendn", "prependn") and out:
            k = min(n, len(out))
            ids, out = out[:k], out[k:]
            if op == "appendn":
                q.append_n(ids)
                model.extend(ids)
            else:
                q.prepend_n(ids)
                model[:0] = ids
        assert q.check_invariants() == model
        assert q.num_free == len(model)


def test_million_block_queue_builds_and_pops() -> None:
    q = FreeBlockQueue(1_000_000)
    assert q.num_free == 999_999
    assert q.popleft_n(3) == [1, 2, 3]
    q.append_n([2])
    q.prepend_n([3, 1])
    assert q.popleft_n(2) == [3, 1]
    q.remove(999_999)
    assert q.num_free == 999_996
