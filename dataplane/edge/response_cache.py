"""Exact-match response cache, opt-in per tenant, for deterministic requests only.

The key is a hard partition: sha256 over (tenant id, variant id, the canonical request body without
transport-only fields), so one tenant can never be served another's answer, and a change of model,
tier or any sampling parameter is a different entry."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import msgspec

TRANSPORT_FIELDS = ("stream", "stream_options", "user", "priority")


def cache_key(tenant_id: str, variant_id: str, kind: str, body: dict[str, Any]) -> str:
    canonical = {k: v for k, v in body.items() if k not in TRANSPORT_FIELDS}
    blob = msgspec.json.encode([tenant_id, variant_id, kind, canonical], order="sorted")
    return hashlib.sha256(blob).hexdigest()


class ResponseCache:
    def __init__(self, max_entries: int = 10_000, ttl_s: float = 600.0) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def get(self, key: str, now: float) -> bytes | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        stored_at, body = hit
        if now - stored_at > self.ttl_s:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return body

    def put(self, key: str, body: bytes, now: float) -> None:
        self._entries[key] = (now, body)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
