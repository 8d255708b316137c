"""Stages 4 and 6: answers from the caches.

The exact cache comes before the limits: a hit is a request (it counts against RPM and
concurrency) but costs no GPU tokens, so it reserves none. The semantic cache (the same question
in other words, in the same scope: system prompt, history, sampling parameters) comes after
them, so a request they refuse costs no embedding.

Every answer says what the cache did (``x-nimbus-cache``). A hit is served as the client asked,
streamed (replayed) or not; a miss fills the cache with its answer, streamed or not (a stream as
the whole answer it adds up to, ``sse.assemble``). With the shared store unreachable the answer
is "bypass" and the request goes to the engines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dataplane.edge.pipeline import account
from dataplane.edge.pipeline.parts import EdgeParts
from dataplane.edge.pipeline.record import RequestRecord
from dataplane.edge.response_cache import BYPASS, HIT, MISS, cache_key
from dataplane.edge.semantic_cache import SEMANTIC, semantic_scope
from dataplane.edge.sse import replay
from dataplane.edge.validation import CHAT
from dataplane.edge.writer import SSE_HEADERS, ResponseWriter, header_pairs, respond_json


@dataclass(slots=True)
class CacheLookup:
    state: str = BYPASS  # what x-nimbus-cache says
    hit: bytes | None = None  # the cached answer
    exact_key: str | None = None  # a miss the exact cache wants filled
    semantic_fill: tuple | None = None  # (scope..., vector) a miss the semantic cache wants filled


# The ``*_wanted`` checks are apart from the lookups so that a request no cache wants (most of
# them) costs no coroutine here.

def exact_wanted(rec: RequestRecord) -> bool:
    assert rec.tenant is not None and rec.req is not None
    return rec.tenant.response_cache and rec.req.deterministic


async def look_up_exact(edge: EdgeParts, rec: RequestRecord, kind: str, body: dict[str, Any]) -> CacheLookup:
    tenant, variant = rec.tenant, rec.variant
    assert tenant is not None and variant is not None
    found = CacheLookup()
    key = cache_key(tenant.id, variant.id, kind, body)
    found.state, found.hit = await edge.response_cache.lookup(key, tenant.id)
    if found.state == MISS:
        found.exact_key = key
    return found


def semantic_wanted(edge: EdgeParts, rec: RequestRecord, found: CacheLookup) -> bool:
    tenant, req = rec.tenant, rec.req
    assert tenant is not None and req is not None
    return found.hit is None and edge.semantic is not None and req.deterministic and tenant.semantic_for(req.model)


async def look_up_semantic(edge: EdgeParts, rec: RequestRecord, kind: str, body: dict[str, Any],
                           found: CacheLookup) -> None:
    tenant, variant = rec.tenant, rec.variant
    assert tenant is not None and variant is not None and edge.semantic is not None
    scoped = semantic_scope(tenant.id, variant.id, kind, body)
    if scoped is None:
        return
    answer = await edge.semantic.lookup(tenant.id, *scoped, tenant.semantic_threshold)
    if answer.state == HIT:
        found.hit, found.state = answer.body, SEMANTIC
        edge.metrics.child(edge.metrics.semantic_scores, rec.model).observe(answer.score)
    elif answer.state == MISS:
        found.state = MISS
        found.semantic_fill = (*scoped, answer.vector)
    rec.rate_headers["x-nimbus-cache"] = found.state


def serve_hit(edge: EdgeParts, rec: RequestRecord, kind: str, hit: bytes, state: str,
              writer: ResponseWriter) -> None:
    req = rec.req
    assert req is not None
    edge.metrics.child(edge.metrics.cache_hits, req.model).inc()
    rec.status, rec.http_status, rec.cache = "ok", 200, state
    rec.response_started = True
    account.meter(edge, rec)
    extra = {**rec.rate_headers, "x-request-id": rec.request_id}
    if req.stream:
        writer.respond(200, SSE_HEADERS + header_pairs(extra), replay(hit, kind == CHAT, req.include_usage))
    else:
        respond_json(writer, 200, hit, extra)


def filler(edge: EdgeParts, tenant_id: str, found: CacheLookup) -> Callable[[bytes], None] | None:
    """What stores a miss's answer (off the answer's path), or None when no cache wants it."""
    exact_key, semantic_fill = found.exact_key, found.semantic_fill
    if exact_key is None and semantic_fill is None:
        return None

    def fill(data: bytes) -> None:
        if exact_key is not None:
            edge.spawn(edge.response_cache.store(exact_key, data, tenant_id))
        if semantic_fill is not None and edge.semantic is not None:
            edge.spawn(edge.semantic.store(tenant_id, *semantic_fill, data))
    return fill
