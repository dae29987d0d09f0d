"""Both index backends, one behaviour: presence, prefix lookups, clearing, invariants."""

from __future__ import annotations

import random

import pytest

from pagedkv.cluster.index import MemoryIndex, Replica, ref_digest
from pagedkv.errors import InvalidArgumentError

A, B, C = Replica(pod="a"), Replica(pod="b", dp_rank=1), Replica(pod="c", dp_rank=0)


@pytest.fixture(params=["memory", "redis"])
def index(request):
    if request.param == "memory":
        idx = MemoryIndex(model="m")
    else:
        from pagedkv.cluster.redis_index import RedisIndex

        idx = RedisIndex(request.getfixturevalue("redis_client"), model="m")
    yield idx
    idx.check_invariants()
    idx.close()


def test_longest_prefix_and_tiers(index):
    index.update(A, added=[(0, 1, "GPU"), (0, 2, "GPU"), (0, 3, "CPU")], removed=[])
    index.update(B, added=[(0, 1, "CPU"), (0, 4, "GPU")], removed=[])
    index.update(C, added=[(1, 1, "GPU")], removed=[])  # another group
    index.check_invariants()
    assert index.longest_prefix(0, [1, 2, 3, 9]) == {A: 3, B: 1}
    assert index.longest_prefix(0, [1, 4]) == {A: 1, B: 2}
    assert index.longest_prefix(0, [1, 2, 3], tier="GPU") == {A: 2}
    assert index.longest_prefix(0, [9, 1]) == {}
    assert index.longest_prefix(0, []) == {}
    assert index.longest_prefix(1, [1, 2]) == {C: 1}
    assert index.held_positions(0, [5, 1, 3]) == {A: {1, 2}, B: {1}}
    assert index.held_positions(0, [5, 1, 3], tier="CPU") == {A: {2}, B: {1}}
    index.update(A, added=[], removed=[(0, 2, "GPU")])
    assert index.longest_prefix(0, [1, 2, 3]) == {A: 1, B: 1}
    assert set(index.replicas()) == {A, B, C}
    assert index.replicas()[A].num_blocks == 2
    assert index.blocks_of(B) == {(0, 1, "CPU"), (0, 4, "GPU")}


def test_clear_and_remove_replica(index):
    refs = [(0, h, "GPU") for h in range(2500)]  # more than one SSCAN chunk
    index.update(A, added=refs, removed=[])
    index.update(B, added=refs[:10], removed=[])
    index.clear_replica(A)
    index.check_invariants()
    assert index.blocks_of(A) == set()
    assert index.longest_prefix(0, [0, 1, 2]) == {B: 3}
    assert A in index.replicas()
    index.set_state(A, "rebuilding")
    assert index.replicas()[A].state == "rebuilding"
    index.remove_replica(A)
    assert A not in index.replicas()
    with pytest.raises(InvalidArgumentError):
        index.set_state(B, "fresh")


def test_random_operations_match_a_model(index):
    rng = random.Random(7)
    model: dict[Replica, set] = {A: set(), B: set(), C: set()}
    for step in range(150):
        replica = rng.choice([A, B, C])
        if rng.random() < 0.05:
            index.clear_replica(replica)
            model[replica].clear()
        else:
            refs = {(rng.randrange(2), rng.randrange(12), rng.choice(["GPU", "CPU"]))
                    for _ in range(rng.randrange(1, 5))}
            added = [r for r in refs if r not in model[replica] and rng.random() < 0.7]
            removed = [r for r in refs if r in model[replica]]
            index.update(replica, added=added, removed=removed)
            model[replica] |= set(added)
            model[replica] -= set(removed)
        if step % 10 == 0:
            index.check_invariants()
        prompt = [rng.randrange(12) for _ in range(4)]
        want = {}
        for r, refs in model.items():
            held = {h for g, h, _ in refs if g == 0}
            n = 0
            while n < len(prompt) and prompt[n] in held:
                n += 1
            if n:
                want[r] = n
        assert index.longest_prefix(0, prompt) == want


def test_replica_keys():
    assert Replica.from_key(Replica(pod="p-1", dp_rank=2).key) == Replica(pod="p-1", dp_rank=2)
    assert Replica.from_key("p|-") == Replica(pod="p")
    for bad in ("p", "p|x", "|-"):
        with pytest.raises(InvalidArgumentError):
            Replica.from_key(bad)
    with pytest.raises(InvalidArgumentError):
        Replica(pod="a|b")


def test_redis_key_layout(redis_client):
    from pagedkv.cluster.redis_index import RedisIndex

    index = RedisIndex(redis_client, model="Qwen/Qwen3-32B")
    index.update(B, added=[(0, 0xABC, "GPU")], removed=[])
    keys = sorted(k.decode() for k in redis_client.keys("*"))
    assert keys == [
        "pkv:{Qwen/Qwen3-32B}:b:0:0000000000000abc",
        "pkv:{Qwen/Qwen3-32B}:digests",
        "pkv:{Qwen/Qwen3-32B}:r:b|1",
        "pkv:{Qwen/Qwen3-32B}:replicas",
    ]
    assert redis_client.smembers(keys[0]) == {b"b|1|GPU"}
    assert redis_client.smembers(keys[2]) == {b"0:0000000000000abc|GPU"}
    # The digest computed by the server's script equals the Python one.
    assert int(redis_client.hget(keys[1], "b|1")) == ref_digest((0, 0xABC, "GPU"))
    # Another model's data is separate.
    other = RedisIndex(redis_client, model="other")
    assert other.longest_prefix(0, [0xABC]) == {}
    with pytest.raises(InvalidArgumentError):
        RedisIndex(redis_client, model="a{b}")
