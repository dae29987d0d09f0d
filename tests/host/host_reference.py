"""A plainly written two-tier reference model of the host tier (one full-attention group).

Device: a free list (front = reused first), ref counts, a hash per block and an index from
hash to the blocks registered under it (earliest first). Host: entries (host block, ready,
pins), a free stack (lowest id first) and an LRU list of ready keys (oldest first). The
rules restate docs/host_tier.md, slowly and obviously; the stateful test compares the
manager with this model after every step.
"""

from __future__ import annotations

from typing import Any

BS = 4


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class TwoTierModel:
    def __init__(self, num_blocks: int, host_blocks: int, write_through: bool,
                 min_hits: int = 0, max_tracked: int = 0) -> None:
        self.write_through = write_through
        # admission: hit counts of the most recently hit keys (oldest first)
        self.min_hits = min_hits
        self.max_tracked = max_tracked
        self.hit_counts: list[list[Any]] = []                # [hash, count]
        # device
        self.free = list(range(1, num_blocks))
        self.ref = dict.fromkeys(range(1, num_blocks), 0)
        self.hash_of: dict[int, bytes] = {}
        self.index: dict[bytes, list[int]] = {}
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}
        # host
        self.host_free = list(range(host_blocks))          # taken from the front
        self.entries: dict[bytes, list[Any]] = {}          # hash -> [host id, ready, pins]
        self.lru: list[bytes] = []
        # in flight
        self.stores: list[tuple[str, list[int], list[int], list[bytes]]] = []
        self.loads: dict[str, tuple[list[bytes], list[int], list[int], int]] = {}

    # ---------------------------------------------------------------- lookups

    def best_hit(self, hashes: list[bytes], num_tokens: int) -> tuple[list[int], list[int]]:
        """(device hit block ids, host block ids continuing it): the longest hit across
        tiers within num_tokens - 1 tokens."""
        limit = min((num_tokens - 1) // BS, len(hashes))
        device: list[int] = []
        i = 0
        while i < limit and self.index.get(hashes[i]):
            device.append(self.index[hashes[i]][0])
            i += 1
        host: list[int] = []
        while i < limit and hashes[i] in self.entries and self.entries[hashes[i]][1]:
            host.append(self.entries[hashes[i]][0])
            i += 1
        return device, host

    # ---------------------------------------------------------------- host

    def _host_touch(self, keys: list[bytes]) -> None:
        for k in keys:
            if k in self.lru:
                self.lru.remove(k)
                self.lru.append(k)

    def offer(self, blocks: list[tuple[int, bytes]], timing: str) -> None:
        plan_dev: list[int] = []
        plan_host: list[int] = []
        plan_hashes: list[bytes] = []
        present: list[bytes] = []
        for b, h in blocks:
            if h in self.entries:
                present.append(h)
                continue
            if self.min_hits and self._hits(h) < self.min_hits:
                continue
            if self.host_free:
                hb = self.host_free.pop(0)
            else:
                victim = next((k for k in self.lru if self.entries[k][2] == 0), None)
                if victim is None:
                    continue
                hb = self.entries.pop(victim)[0]
                self.lru.remove(victim)
            self.entries[h] = [hb, False, 0]
            plan_dev.append(b)
            plan_host.append(hb)
            plan_hashes.append(h)
        self._host_touch(present)
        if plan_dev:
            self.stores.append((timing, plan_dev, plan_host, plan_hashes))

    def _hits(self, h: bytes) -> int:
        return next((c for k, c in self.hit_counts if k == h), 0)

    def count_hits(self, keys: list[bytes]) -> None:
        if not self.min_hits:
            return
        for h in keys:
            n = self._hits(h) + 1
            self.hit_counts = [kc for kc in self.hit_counts if kc[0] != h] + [[h, n]]
            if len(self.hit_counts) > self.max_tracked:
                self.hit_counts.pop(0)

    def complete_store(self, i: int, success: bool) -> None:
        _, _, _, hashes = self.stores.pop(i)
        for h in hashes:
            if success:
                self.entries[h][1] = True
                self.lru.append(h)
            else:
                hb = self.entries.pop(h)[0]
                self.host_free.append(hb)
                self.host_free.sort()

    # ---------------------------------------------------------------- device

    def _register(self, rid: str, hashes: list[bytes], num_tokens: int) -> None:
        table = self.tables[rid]
        full = min(num_tokens // BS, len(table))
        registered = []
        for i in range(self.num_cached[rid], full):
            b = table[i]
            if self.hash_of.get(b) == hashes[i]:
                continue
            self.hash_of[b] = hashes[i]
            self.index.setdefault(hashes[i], []).append(b)
            registered.append((b, hashes[i]))
        self.num_cached[rid] = max(self.num_cached[rid], full)
        if self.write_through and registered:
            self.offer(registered, "after_forward")

    def allocate(self, rid: str, hashes: list[bytes], num_tokens: int, device_hit: list[int],
                 host_hit: list[int]) -> list[int] | None:
        need = cdiv(num_tokens, BS) - len(device_hit)
        need += sum(1 for b in device_hit if self.ref[b] == 0)
        if need > len(self.free):
            return None
        d = len(device_hit)
        keys = hashes[d:d + len(host_hit)]
        for k in keys:  # the loaded host blocks are pinned before the device evicts
            self.entries[k][2] += 1
        for b in device_hit:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        n_new = cdiv(num_tokens, BS) - len(device_hit)
        new = self.free[:n_new]
        del self.free[:n_new]
        # as vLLM: the loaded (external) blocks are taken first, then the new tokens'
        # blocks; each take offers its own evictions
        for batch in (new[:len(host_hit)], new[len(host_hit):]):
            victims = []
            for b in batch:
                self.ref[b] = 1
                h = self.hash_of.pop(b, None)
                if h is not None:
                    self.index[h].remove(b)
                    if not self.index[h]:
                        del self.index[h]
                    victims.append((b, h))
            victims = [(b, h) for b, h in victims if h not in self.index]
            if victims and not self.write_through:
                self.offer(victims, "before_forward")
        self.tables[rid] = device_hit + new
        self.num_cached[rid] = len(device_hit)
        self.count_hits(hashes[:len(device_hit) + len(host_hit)])
        if host_hit:
            self._host_touch(list(reversed(keys)))
            self.loads[rid] = (keys, host_hit, new[:len(host_hit)], d * BS)
        else:
            self._register(rid, hashes, num_tokens)
        return new[len(host_hit):]  # the loaded blocks are not returned, as vLLM's

    def complete_load(self, rid: str, hashes: list[bytes], num_tokens: int,
                      success: bool) -> None:
        keys, _, _, _ = self.loads.pop(rid)
        for k in keys:
            self.entries[k][2] -= 1
        if success:
            self._register(rid, hashes, num_tokens)

    def free_request(self, rid: str) -> None:
        table = self.tables.pop(rid)
        del self.num_cached[rid]
        front: list[int] = []
        back: list[int] = []
        for b in reversed(table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (back if b in self.hash_of else front).append(b)
        self.free = front + self.free + back
