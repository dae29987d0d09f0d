"""The Redis/Valkey backend of the cluster prefix index.

Key layout, for model ``M`` (every key carries the hash tag ``{M}``, so one model's keys
share a Redis Cluster slot and a server-side script may touch all of them):

=====================================  ======  ===============================================
key                                    type    members
=====================================  ======  ===============================================
``pkv:{M}:b:<group>:<hash>``           SET     ``<pod>|<rank>|<tier>``: who holds the block
``pkv:{M}:r:<pod>|<rank>``             SET     ``<group>:<hash>|<tier>``: what a replica holds
``pkv:{M}:replicas``                   HASH    ``<pod>|<rank>`` → ``synced`` / ``rebuilding``
``pkv:{M}:digests``                    HASH    ``<pod>|<rank>`` → digest of its block set
``pkv:{M}:w:<pod>|<rank>``             STRING  the ingest holding the replica's writer lease
                                               (expires unless renewed: ``PX``)
=====================================  ======  ===============================================

``<hash>`` is the block's wire hash in 16 lower-case hex digits, ``<rank>`` the DP rank or
``-``. Operations:

* **update** (one event batch of one replica): one ``EVALSHA`` of a Lua script that
  adds (``SADD``) or removes (``SREM``) the replica in each changed block key and the
  reference in its reverse set (atomic, so the forward and reverse sets never disagree),
  and adds or subtracts each reference's share of the replica's digest
  (:func:`~pagedkv.cluster.index.ref_digest`, computed server-side with ``sha1hex``) for
  the members that really changed; under a writer lease the script first checks that the
  caller holds it (else nothing is written);
* **writer lease** (one per replica, :meth:`~ClusterIndex.claim_writer`): a ``SET ... PX``
  key renewed by its holder; a script takes it only when absent (expired: the holder
  died) or already the caller's;
* **clear a replica** (restart, ``AllBlocksCleared``, unrepairable gap): ``SSCAN`` its
  reverse set in chunks of 1,000, ``SREM`` itself from each block key and the chunk from
  the reverse set (one transaction per chunk), ``DEL`` the reverse set — O(what it held),
  never a keyspace scan;
* **longest prefix**: one ``EVALSHA`` of a Lua script over the prompt's block keys that
  keeps the replicas still matching (one ``SMEMBERS`` per block) and stops at the first
  block none of them holds (early exit, one round trip);
* **held positions** (windowed groups of hybrid models): one pipeline of ``SMEMBERS``.

Needs the ``cluster`` extra (``redis`` >= 5). Any connection problem surfaces as
:class:`~pagedkv.cluster.index.IndexUnavailableError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.cluster.index import (
    ANY_TIER,
    DIGEST_MODULUS,
    BlockRef,
    ClusterIndex,
    IndexUnavailableError,
    Replica,
    ReplicaState,
    WriterConflictError,
    _check_state,
    ref_digest,
    ref_member,
)
from pagedkv.errors import InvalidArgumentError, require

__all__ = ["RedisIndex", "connect"]

_CLEAR_CHUNK = 1000

# The scripts build their block keys from one hash-tagged prefix (so every key they touch
# is in the declared KEYS[1]'s Redis Cluster slot) instead of receiving hundreds of KEYS:
# packing one argument costs the client far less than packing one per block.

# KEYS[1]: the prompt's first block key. ARGV[1]: block key prefix ("pkv:{M}:b:<g>:"),
# ARGV[2]: the block hashes, 16 hex digits each, ARGV[3]: tier to require ("" = any).
# Returns a flat array: replica key, blocks matched, replica key, blocks matched, ...
_LONGEST_PREFIX_LUA = """
local prefix, hashes, want = ARGV[1], ARGV[2], ARGV[3]
local replica_of = {}  -- member -> its replica, or false when its tier is not wanted
local alive = nil
local counts = {}
for i = 1, #hashes / 16 do
  local members = redis.call('SMEMBERS', prefix .. string.sub(hashes, i * 16 - 15, i * 16))
  local nxt = {}
  local any = false
  for _, m in ipairs(members) do
    local r = replica_of[m]
    if r == nil then
      local cut = string.find(m, '|[^|]*$')
      r = (want == '' or string.sub(m, cut + 1) == want) and string.sub(m, 1, cut - 1)
      replica_of[m] = r
    end
    if r and (alive == nil or alive[r]) then nxt[r] = true; any = true end
  end
  if not any then break end
  for r in pairs(nxt) do counts[r] = i end
  alive = nxt
end
local out = {}
for r, c in pairs(counts) do
  out[#out + 1] = r
  out[#out + 1] = c
end
return out
"""

# KEYS[1]: the replica's reverse set, KEYS[2]: the replicas hash. ARGV[1]: block key
# prefix ("pkv:{M}:b:"), ARGV[2]: the replica key, ARGV[3]: added and ARGV[4]: removed
# references, each "<group>:<hash>|<tier>" (the reverse member), comma-separated.
# Atomic: the forward and reverse sets change together.
# KEYS[3]: the digests hash, KEYS[4]: the writer lease key; ARGV[5]: the writer ("" = no
# lease check); returns 1, writing nothing, when the lease is not the writer's. The
# digest is a sum modulo 2^48 of each member's first 48 bits of SHA-1 (exact in Lua's
# doubles), changed only for members really added/removed.
_UPDATE_LUA = """
local prefix, rkey = ARGV[1], ARGV[2]
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[5] then
  return 1
end
local modulus = 281474976710656
local digest = tonumber(redis.call('HGET', KEYS[3], rkey) or '0')
redis.call('HSETNX', KEYS[2], rkey, 'synced')
for ref in string.gmatch(ARGV[3], '[^,]+') do
  local cut = string.find(ref, '|', 1, true)
  redis.call('SADD', prefix .. string.sub(ref, 1, cut - 1), rkey .. string.sub(ref, cut))
  if redis.call('SADD', KEYS[1], ref) == 1 then
    digest = (digest + tonumber(string.sub(redis.sha1hex(ref), 1, 12), 16)) % modulus
  end
end
for ref in string.gmatch(ARGV[4], '[^,]+') do
  local cut = string.find(ref, '|', 1, true)
  redis.call('SREM', prefix .. string.sub(ref, 1, cut - 1), rkey .. string.sub(ref, cut))
  if redis.call('SREM', KEYS[1], ref) == 1 then
    digest = (digest - tonumber(string.sub(redis.sha1hex(ref), 1, 12), 16)) % modulus
  end
end
redis.call('HSET', KEYS[3], rkey, string.format('%.0f', digest))
return 0
"""

# KEYS[1]: the lease key. ARGV[1]: the writer, ARGV[2]: time to live in ms. Returns the
# holder when another writer holds the lease, else takes or renews it and returns "".
_CLAIM_LUA = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return holder
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ''
"""

# KEYS[1]: the lease key. ARGV[1]: the writer. Deletes the lease only if it is the writer's.
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 0
"""


def connect(url: str, *, timeout_s: float = 1.0) -> Any:
    """A ``redis.Redis`` client for ``url`` (``redis://host:port/db``) with short socket
    timeouts, so an unreachable server fails fast. Raises MissingDependencyError
    without the ``cluster`` extra; InvalidArgumentError for a malformed URL."""
    redis: Any = require("redis", "cluster", "the Redis cluster index")
    try:
        return redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"bad Redis URL {url!r}: {exc}") from exc


class RedisIndex(ClusterIndex):
    """:class:`ClusterIndex` on a Redis or Valkey server (module docstring).

    ``client`` is a ``redis.Redis`` (see :func:`connect`). Safe to use from many
    processes; one instance is not thread-safe.
    """

    def __init__(self, client: Any, *, model: str) -> None:
        if not model or "{" in model or "}" in model:
            raise InvalidArgumentError(f"a model name must be non-empty, without braces: {model!r}")
        self._redis_errors: Any = require("redis", "cluster", "the Redis cluster index")
        self._client = client
        self.model = model
        self._prefix = f"pkv:{{{model}}}:"
        self._replicas_key = self._prefix + "replicas"
        self._digests_key = self._prefix + "digests"
        self._longest = client.register_script(_LONGEST_PREFIX_LUA)
        self._update = client.register_script(_UPDATE_LUA)
        self._claim = client.register_script(_CLAIM_LUA)
        self._release = client.register_script(_RELEASE_LUA)

    # --- keys -------------------------------------------------------------------------

    def block_key(self, group_idx: int, block_hash: int) -> str:
        """The SET key of one block: ``pkv:{M}:b:<group>:<hash hex>``."""
        return f"{self._prefix}b:{group_idx}:{block_hash:016x}"

    def reverse_key(self, replica: Replica) -> str:
        """The reverse SET key of one replica: ``pkv:{M}:r:<pod>|<rank>``."""
        return f"{self._prefix}r:{replica.key}"

    # --- writes -------------------------------------------------------------------------

    def lease_key(self, replica: Replica) -> str:
        """The writer lease key of one replica: ``pkv:{M}:w:<pod>|<rank>``."""
        return f"{self._prefix}w:{replica.key}"

    def claim_writer(self, replica: Replica, writer: str, ttl_s: float) -> str | None:
        with self._guard():
            holder = self._claim(keys=[self.lease_key(replica)],
                                 args=[writer, max(1, int(ttl_s * 1000))])
        return holder.decode() if holder else None

    def release_writer(self, replica: Replica, writer: str) -> None:
        with self._guard():
            self._release(keys=[self.lease_key(replica)], args=[writer])

    def update(
        self, replica: Replica, *, added: Sequence[BlockRef], removed: Sequence[BlockRef],
        writer: str | None = None,
    ) -> None:
        if not added and not removed:
            return
        with self._guard():
            conflict = self._update(
                keys=[self.reverse_key(replica), self._replicas_key, self._digests_key,
                      self.lease_key(replica)],
                args=[
                    self._prefix + "b:",
                    replica.key,
                    ",".join([ref_member(ref) for ref in added]),
                    ",".join([ref_member(ref) for ref in removed]),
                    writer or "",
                ],
            )
        if conflict:
            raise WriterConflictError(
                f"{replica.key}: writer {writer!r} does not hold the writer lease",
                holder="")

    def clear_replica(self, replica: Replica) -> None:
        rkey = replica.key
        reverse_key = self.reverse_key(replica)
        with self._guard():
            client = self._client
            cursor = 0
            while True:
                cursor, members = client.sscan(reverse_key, cursor, count=_CLEAR_CHUNK)
                if members:
                    # One transaction per chunk: the forward entries and their reverse
                    # members go together, so an interrupted clear leaves both in step.
                    pipe = client.pipeline(transaction=True)
                    for raw in members:
                        ref, _, tier = raw.decode().rpartition("|")
                        pipe.srem(f"{self._prefix}b:{ref}", f"{rkey}|{tier}")
                    pipe.srem(reverse_key, *members)
                    pipe.execute()
                if cursor == 0:
                    break
            pipe = client.pipeline(transaction=True)
            pipe.delete(reverse_key)
            pipe.hdel(self._digests_key, rkey)
            pipe.execute()

    def set_state(self, replica: Replica, state: str) -> None:
        _check_state(state)
        with self._guard():
            self._client.hset(self._replicas_key, replica.key, state)

    def remove_replica(self, replica: Replica) -> None:
        self.clear_replica(replica)
        with self._guard():
            self._client.hdel(self._replicas_key, replica.key)

    # --- reads --------------------------------------------------------------------------

    def replicas(self) -> dict[Replica, ReplicaState]:
        with self._guard():
            raw = self._client.hgetall(self._replicas_key)
            keys = [k.decode() for k in raw]
            pipe = self._client.pipeline(transaction=False)
            pipe.hgetall(self._digests_key)
            for key in keys:
                pipe.scard(f"{self._prefix}r:{key}")
            digests, *sizes = pipe.execute()
        return {
            Replica.from_key(key): ReplicaState(
                state=raw[key.encode()].decode(), num_blocks=n,
                digest=int(digests.get(key.encode(), b"0")))
            for key, n in zip(keys, sizes, strict=True)
        }

    def longest_prefix(
        self, group_idx: int, block_hashes: Sequence[int], *, tier: str | None = ANY_TIER
    ) -> dict[Replica, int]:
        if not block_hashes:
            return {}
        with self._guard():
            flat = self._longest(
                keys=[self.block_key(group_idx, block_hashes[0])],
                args=[f"{self._prefix}b:{group_idx}:",
                      "".join([f"{h:016x}" for h in block_hashes]),
                      "" if tier is None else tier],
            )
        return {
            Replica.from_key(flat[i].decode()): int(flat[i + 1]) for i in range(0, len(flat), 2)
        }

    def held_positions(
        self, group_idx: int, block_hashes: Sequence[int], *, tier: str | None = ANY_TIER
    ) -> dict[Replica, set[int]]:
        if not block_hashes:
            return {}
        with self._guard():
            pipe = self._client.pipeline(transaction=False)
            for h in block_hashes:
                pipe.smembers(f"{self._prefix}b:{group_idx}:{h:016x}")
            answers = pipe.execute()
        out: dict[Replica, set[int]] = {}
        for position, members in enumerate(answers):
            for raw in members:
                rkey, _, member_tier = raw.decode().rpartition("|")
                if tier is None or member_tier == tier:
                    out.setdefault(Replica.from_key(rkey), set()).add(position)
        return out

    def blocks_of(self, replica: Replica) -> set[BlockRef]:
        with self._guard():
            members = self._client.smembers(self.reverse_key(replica))
        refs: set[BlockRef] = set()
        for raw in members:
            ref, _, tier = raw.decode().rpartition("|")
            group, _, hex_hash = ref.partition(":")
            refs.add((int(group), int(hex_hash, 16), tier))
        return refs

    def check_invariants(self) -> None:
        """Every reverse entry has its forward entry and vice versa (scans the model's
        keys: for tests and small indexes only)."""
        with self._guard():
            forward: set[tuple[str, str]] = set()
            for key in self._client.scan_iter(match=f"{self._prefix}b:*", count=1000):
                ref = key.decode()[len(self._prefix) + 2 :]
                for raw in self._client.smembers(key):
                    rkey, _, tier = raw.decode().rpartition("|")
                    forward.add((rkey, f"{ref}|{tier}"))
            reverse: set[tuple[str, str]] = set()
            registered = {k.decode() for k in self._client.hkeys(self._replicas_key)}
            for key in self._client.scan_iter(match=f"{self._prefix}r:*", count=1000):
                rkey = key.decode()[len(self._prefix) + 2 :]
                assert rkey in registered, f"replica {rkey} holds blocks but is not registered"
                for raw in self._client.smembers(key):
                    reverse.add((rkey, raw.decode()))
        assert forward == reverse, (
            f"forward and reverse sets disagree: {sorted(forward ^ reverse)[:5]}"
        )
        for replica, state in self.replicas().items():
            expected = sum(ref_digest(r) for r in self.blocks_of(replica)) % DIGEST_MODULUS
            assert state.digest == expected, f"{replica.key}: digest out of step"

    def close(self) -> None:
        self._client.close()

    def _guard(self) -> _Guard:
        return _Guard(self._redis_errors)


class _Guard:
    """Turns redis-py's connection failures into IndexUnavailableError."""

    def __init__(self, redis: Any) -> None:
        self._errors = (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            redis.exceptions.BusyLoadingError,
        )

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and isinstance(exc, self._errors):
            raise IndexUnavailableError(f"Redis is unreachable: {exc}") from exc

