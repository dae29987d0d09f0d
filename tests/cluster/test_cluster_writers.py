"""One writer per replica, batches all or nothing, healing by content.

* a batch with a malformed record changes nothing (counts and index as before);
* heal() rewrites a replica whose entries differ in content though not in number;
* two ingests following one pod into one index: only the lease holder writes, so the
  other's repairs (a clear after an unrepairable gap) never reach the index; when the
  holder dies (stops renewing) or closes, the other takes over and rewrites the replica
  from its own counts.
"""

from __future__ import annotations

import time

import pytest

from pagedkv.cluster import MemoryIndex, Replica
from pagedkv.cluster.index import ref_digest
from pagedkv.cluster.ingest import IndexIngest
from pagedkv.core.records import AllBlocksCleared, BlockRemoved, BlockStored
from pagedkv.errors import InvalidArgumentError

POD = "pod0"
R = Replica(pod=POD)


def stored(*hashes: int, medium: str | None = "GPU") -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_block_hash=None,
                       token_ids=[0] * (2 * len(hashes)), block_size=2, lora_id=None,
                       medium=medium, lora_name=None, extra_keys=None, group_idx=0)


def removed(*hashes: int) -> BlockRemoved:
    return BlockRemoved(block_hashes=list(hashes), medium="GPU", group_idx=0)


@pytest.fixture(params=["memory", "redis"])
def index(request):
    if request.param == "memory":
        yield MemoryIndex(model="m")
        return
    from pagedkv.cluster.redis_index import RedisIndex, connect

    server = request.getfixturevalue("redis_server")
    idx = RedisIndex(connect(server.url), model="m")
    yield idx
    idx.close()


BAD_RECORDS = [
    "not an event",
    None,
    stored(7)._replace(group_idx=-1),
    stored(7)._replace(group_idx=True),
    stored(7)._replace(medium=5),
    stored(7)._replace(block_hashes=None),
    stored(7)._replace(block_hashes=[1.5]),
    stored(7)._replace(block_hashes=[object()]),
    removed(1)._replace(block_hashes=[-1]),
]


@pytest.mark.parametrize("bad", BAD_RECORDS, ids=lambda b: type(b).__name__)
def test_a_batch_with_a_bad_record_changes_nothing(index, bad):
    ingest = IndexIngest(index)
    ingest.apply(POD, [stored(1, 2, 3)])
    before = (ingest.expected_blocks(POD), index.blocks_of(R), index.replicas())
    with pytest.raises(InvalidArgumentError):
        ingest.apply(POD, [removed(1), stored(9), AllBlocksCleared(), stored(10), bad])
    assert (ingest.expected_blocks(POD), index.blocks_of(R), index.replicas()) == before
    assert index.blocks_of(R) == {(0, h, "GPU") for h in (1, 2, 3)}
    ingest.check_invariants()
    index.check_invariants()


def test_heal_compares_content_not_only_counts(index):
    ingest = IndexIngest(index)
    ingest.apply(POD, [stored(1, 2, 3)])
    assert ingest.heal()
    # Same number of blocks, other content: a count comparison would call this intact.
    index.update(R, added=[(0, 99, "GPU")], removed=[(0, 2, "GPU")])
    assert index.replicas()[R].num_blocks == ingest.num_blocks(POD)
    assert index.replicas()[R].digest != sum(
        ref_digest(r) for r in ingest.expected_blocks(POD)) % (1 << 48)
    assert ingest.heal()
    assert index.blocks_of(R) == ingest.expected_blocks(POD)
    ingest.check_invariants()
    index.check_invariants()


def test_two_ingests_of_one_pod_do_not_flap(index):
    a = IndexIngest(index, lease_ttl_s=60, writer_id="a")
    b = IndexIngest(index, lease_ttl_s=60, writer_id="b")
    a.add_publisher(POD)
    b.add_publisher(POD)
    seen = []
    for step in range(6):
        batch = [stored(10 + step), stored(20 + step)]
        a.apply(POD, batch)
        b.apply(POD, batch)
        if step == 2:  # b lost events for good: it clears its copy and rebuilds
            b.mark_rebuilding(POD)
        assert a.heal() and b.heal()
        seen.append(index.replicas()[R].num_blocks)
    assert seen == [2, 4, 6, 8, 10, 12]  # never cleared by the standby
    assert index.blocks_of(R) == a.expected_blocks(POD)
    assert index.replicas()[R].state == "synced"
    assert b.num_standby_replicas == 1 and a.num_standby_replicas == 0
    a.check_invariants()
    index.check_invariants()


def test_the_standby_takes_over_when_the_writer_closes(index):
    a = IndexIngest(index, lease_ttl_s=60, writer_id="a")
    b = IndexIngest(index, lease_ttl_s=60, writer_id="b")
    for ingest in (a, b):
        ingest.apply(POD, [stored(1, 2)])
    b.apply(POD, [stored(3)])  # b saw a batch a did not (a is about to go)
    a.close()
    assert b.heal()
    assert index.blocks_of(R) == b.expected_blocks(POD) == {(0, h, "GPU") for h in (1, 2, 3)}
    # a's late write is refused (it no longer holds the lease): nothing changes.
    a.apply(POD, [removed(1, 2)])
    assert index.blocks_of(R) == b.expected_blocks(POD)
    index.check_invariants()


def test_the_standby_takes_over_when_the_writer_dies(index):
    a = IndexIngest(index, lease_ttl_s=0.2, writer_id="a")
    b = IndexIngest(index, lease_ttl_s=0.2, writer_id="b")
    for ingest in (a, b):
        ingest.apply(POD, [stored(1)])
    b.apply(POD, [stored(2)])
    # a dies: it never renews. b takes over once the lease lapses.
    deadline = time.monotonic() + 30  # a hang guard, not a timing assertion
    while b.num_standby_replicas or index.blocks_of(R) != b.expected_blocks(POD):
        assert time.monotonic() < deadline, "the standby never took over"
        b.heal()
        time.sleep(0.02)
    assert index.blocks_of(R) == {(0, 1, "GPU"), (0, 2, "GPU")}
    index.check_invariants()


def test_lease_ttl_is_checked():
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(InvalidArgumentError, match="lease_ttl_s"):
            IndexIngest(MemoryIndex(model="m"), lease_ttl_s=bad)
