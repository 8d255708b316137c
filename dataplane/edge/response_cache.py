"""Exact-match response cache, opt-in per tenant, for deterministic requests only.

The key is a hard partition: sha256 over (tenant id, variant id, the canonical request body without
transport-only fields), so one tenant can never be served another's answer, and a change of model,
tier or any sampling parameter is a different entry.

Two stores behind one interface (``lookup`` / ``store``):

* ``SharedResponseCache``: entries in Redis, shared by every edge of a region, so a restart or a
  second edge does not start cold. Keys are per tenant, so a tenant's entries can be purged. Each entry expires ``ttl_s`` after it was stored (a hit does
  not extend it: the TTL bounds how stale an answer may be), and the region's index (a sorted set
  of keys by last use) bounds the count: past ``max_entries`` the least recently used go. An
  answer larger than ``max_entry_bytes`` is not stored. With Redis unreachable every lookup is a
  ``bypass`` (never an error, never a wrong answer) until ``retry_s`` has passed.
* ``ResponseCache``: the same in this edge's memory, for an edge without Redis (standalone).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from typing import Any

import msgspec

log = logging.getLogger("nimbus.edge.cache")

TRANSPORT_FIELDS = ("stream", "stream_options", "user", "priority")
HIT, MISS, BYPASS = "hit", "miss", "bypass"


def cache_key(tenant_id: str, variant_id: str, kind: str, body: dict[str, Any]) -> str:
    canonical = {k: v for k, v in body.items() if k not in TRANSPORT_FIELDS}
    blob = msgspec.json.encode([tenant_id, variant_id, kind, canonical], order="sorted")
    return hashlib.sha256(blob).hexdigest()


class ResponseCache:
    """In this edge's memory: LRU-bounded, entries expire ``ttl_s`` after they were stored."""

    def __init__(self, max_entries: int = 10_000, ttl_s: float = 600.0, max_entry_bytes: int = 1 << 20) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.max_entry_bytes = max_entry_bytes
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    async def lookup(self, key: str, tenant_id: str) -> tuple[str, bytes | None]:
        key = f"{tenant_id}:{key}"
        hit = self._entries.get(key)
        if hit is None:
            return MISS, None
        stored_at, body = hit
        if time.monotonic() - stored_at > self.ttl_s:
            del self._entries[key]
            return MISS, None
        self._entries.move_to_end(key)
        return HIT, body

    async def store(self, key: str, body: bytes, tenant_id: str) -> bool:
        if len(body) > self.max_entry_bytes:
            return False
        key = f"{tenant_id}:{key}"
        self._entries[key] = (time.monotonic(), body)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return True

    @property
    def usable(self) -> bool:
        return True


class SharedResponseCache:
    """In Redis, shared by a region's edges (see the module docstring)."""

    def __init__(self, redis: Any, prefix: str, region: str, *, max_entries: int = 10_000, ttl_s: float = 600.0,
                 max_entry_bytes: int = 1 << 20, retry_s: float = 1.0) -> None:
        self.redis = redis
        self.max_entries = max_entries
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.max_entry_bytes = max_entry_bytes
        self.retry_s = retry_s
        self._root = f"{prefix}rcache:{region}:"
        self._index = self._root + "lru"
        self._down_until = 0.0

    def entry_key(self, member: str) -> str:
        """``member`` is ``tenant:key``, as the index holds it."""
        return self._root + member

    def tenant_pattern(self, tenant_id: str) -> str:
        return f"{self._root}{tenant_id}:*"

    @property
    def usable(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, what: str, exc: Exception) -> None:
        # One line per outage, not per request: the next try is ``retry_s`` away.
        log.warning("response cache %s failed, bypassing it for %.1fs: %r", what, self.retry_s, exc)
        self._down_until = time.monotonic() + self.retry_s

    async def lookup(self, key: str, tenant_id: str) -> tuple[str, bytes | None]:
        if not self.usable:
            return BYPASS, None
        member = f"{tenant_id}:{key}"
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.get(self.entry_key(member))
                pipe.zadd(self._index, {member: time.time()}, xx=True)  # last use, for the count bound
                body, _ = await pipe.execute()
        except Exception as exc:  # any Redis failure means "no cache", never an error
            self._failed("lookup", exc)
            return BYPASS, None
        return (HIT, bytes(body)) if body is not None else (MISS, None)

    async def store(self, key: str, body: bytes, tenant_id: str) -> bool:
        """True once stored; False when too large or Redis failed."""
        if len(body) > self.max_entry_bytes or not self.usable:
            return False
        member = f"{tenant_id}:{key}"
        now = time.time()
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(self.entry_key(member), body, px=self.ttl_ms)
                pipe.zadd(self._index, {member: now})
                # Index entries not used for a whole TTL can only name expired entries.
                pipe.zremrangebyscore(self._index, "-inf", now - self.ttl_ms / 1000)
                pipe.zcard(self._index)
                *_, count = await pipe.execute()
                over = count - self.max_entries
                if over > 0:
                    evicted = await self.redis.zpopmin(self._index, over)
                    if evicted:
                        await self.redis.delete(*(self.entry_key(k.decode() if isinstance(k, bytes) else k)
                                                  for k, _ in evicted))
        except Exception as exc:  # any Redis failure means "not stored", never an error
            self._failed("store", exc)
            return False
        return True
