"""Stage 9: the request to the engine and its answer back to the client.

Each attempt is admitted and routed afresh (``admit``, ``route``); an attempt that fails before
the client's first byte is tried once more elsewhere, within the retry budget, and
``failures.py`` decides whose fault it was. A streamed answer is relayed by ``stream.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import msgspec

from dataplane.edge import errors
from dataplane.edge.echo import echo
from dataplane.edge.pipeline import account, admit, route
from dataplane.edge.pipeline.failures import DONE_OK, Failure, charge, engine_client_error, judge, unverified
from dataplane.edge.pipeline.parts import EdgeParts
from dataplane.edge.pipeline.record import RequestRecord
from dataplane.edge.pipeline.stream import relay_stream
from dataplane.edge.policies import RouteRequest
from dataplane.edge.prefix import block_hashes
from dataplane.edge.router import Ticket
from dataplane.edge.routes import ENGINE_PATHS
from dataplane.edge.upstream import ConnectFailed, UpstreamError
from dataplane.edge.validation import upstream_body
from dataplane.edge.writer import ResponseWriter, respond_json

log = logging.getLogger("nimbus.edge")


async def relay(edge: EdgeParts, rec: RequestRecord, kind: str, writer: ResponseWriter,
                fill: Callable[[bytes], None] | None) -> None:
    req, tenant, variant = rec.req, rec.tenant, rec.variant
    assert req is not None and tenant is not None and variant is not None
    s = edge.settings
    route_req = RouteRequest(block_hashes(req.prompt_text, s.prefix_block_chars), req.prompt_tokens_est,
                             len(req.prompt_text), tenant.id, req.max_tokens)
    payload = upstream_body(req, variant.served_model_name, rec.priority, variant.priority_scheduling)
    path = ENGINE_PATHS[kind]
    excluded: set[str] = set()
    retry_budget = edge.router.retry_budget
    retry_budget.on_request(time.monotonic())
    first: Failure | None = None
    for _attempt in (0, 1):
        ticket = await admit.acquire(edge, rec, route_req, excluded)
        outcome = await forward(edge, rec, ticket, path, payload, writer, fill)
        if not isinstance(outcome, Failure):
            if first is not None:  # another replica served it: the first one's failure was its own
                charge(edge, first)
            return
        if first is not None:
            raise judge(edge, rec, first, outcome)
        first = outcome
        excluded.add(ticket.replica.id)
        if not _another_replica(edge, rec, excluded):
            # Nobody to tell a bad replica from a bad request: answer now, blame nobody.
            raise unverified(first)
        if not retry_budget.try_spend(time.monotonic()):
            edge.metrics.child(edge.metrics.retry_denied, req.model).inc()
            raise unverified(first)
        edge.metrics.child(edge.metrics.retries, req.model, "before_first_byte").inc()
    raise errors.upstream_failed()  # not reached: the second attempt returns or raises


def _another_replica(edge: EdgeParts, rec: RequestRecord, excluded: set[str]) -> bool:
    catalog = edge.catalog
    if catalog is None or rec.tenant is None or rec.variant is None:
        return False
    replicas = catalog.candidates(rec.tenant.id, rec.variant.id)
    return bool(edge.router.eligible(catalog, replicas, time.monotonic(), excluded))


async def forward(edge: EdgeParts, rec: RequestRecord, ticket: Ticket, path: str, payload: bytes,
                  writer: ResponseWriter, fill: Callable[[bytes], None] | None) -> str | Failure:
    """One attempt on the replica ``ticket`` holds."""
    assert rec.req is not None
    req = rec.req
    rid = ticket.replica.id
    s = edge.settings
    metrics, release = edge.metrics, route.release
    try:
        resp = await edge.upstream.post(
            ticket.replica.url, path, payload,
            {"Content-Type": "application/json", "X-Request-Id": rec.request_id},
            connect_timeout=s.connect_timeout_s,
            first_byte_timeout=s.stream_idle_timeout_s if req.stream else s.first_byte_timeout_s)
    except (ConnectFailed, TimeoutError) as exc:
        # Not reached, or no answer in time: the replica's, whatever the request holds.
        log.info("replica %s failed before answering: %r", rid, exc)
        metrics.child(metrics.errors, req.model, rid, "connect").inc()
        release(edge, rec, ticket, False)
        return Failure(rid, "timeout" if isinstance(exc, TimeoutError) else "connect", charged=True)
    except (UpstreamError, OSError) as exc:
        log.info("replica %s broke the connection before answering: %r", rid, exc)
        metrics.child(metrics.errors, req.model, rid, "reset").inc()
        release(edge, rec, ticket, None)
        return Failure(rid, "broke")
    try:
        if resp.status >= 500:
            metrics.child(metrics.errors, req.model, rid, f"http_{resp.status}").inc()
            release(edge, rec, ticket, None)  # judged once another replica has had the request
            return Failure(rid, "http", resp.status)
        if resp.status != 200:
            # The engine refused the request itself (a 4xx): not the replica's fault, not retried.
            data = b""
            with contextlib.suppress(UpstreamError, TimeoutError, OSError):
                data = await resp.read(min(s.first_byte_timeout_s, 10.0))
            release(edge, rec, ticket, None)
            raise engine_client_error(resp.status, data)
        if req.stream:
            return await relay_stream(edge, rec, ticket, resp, writer, fill)
        try:
            data = await resp.read(s.first_byte_timeout_s)
        except (UpstreamError, TimeoutError, OSError) as exc:
            log.info("replica %s failed while answering: %r", rid, exc)
            metrics.child(metrics.errors, req.model, rid, "read").inc()
            release(edge, rec, ticket, None)
            return Failure(rid, "broke")
        rec.ttft_ms = (time.monotonic() - rec.t0) * 1000
        data = echo(data, rec.echo)
        try:
            rec.usage = msgspec.json.decode(data).get("usage")
        except (msgspec.DecodeError, AttributeError):
            rec.usage = None
        release(edge, rec, ticket, True, route.engine_counted(rec.usage))
        rec.status, rec.http_status, rec.response_started = "ok", 200, True
        if fill is not None:
            fill(data)
        account.meter(edge, rec)
        respond_json(writer, 200, data, {**rec.rate_headers, "x-request-id": rec.request_id})
        return DONE_OK
    finally:
        if resp.pauses:
            metrics.upstream_paused.inc(resp.pauses)
        resp.close()  # also aborts the engine's work when we leave early (client gone)
