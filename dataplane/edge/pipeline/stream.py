"""Stage 9, streamed: an engine's SSE stream relayed to the client, token events as they come.

The hot path is a synchronous sink: once the response has started, a chunk of whole plain token
events goes from the upstream parser straight to the client's socket without waking this task.
Everything else (the first token, usage, errors, ``[DONE]``, partial events, a backed-up client)
takes the loop below, in order. Until the first output event nothing is sent, so a failure then
can still be retried on another replica.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from dataplane.edge.echo import echo
from dataplane.edge.pipeline import account, route
from dataplane.edge.pipeline.failures import DONE_ERROR, DONE_OK, Failure, engine_stream_refusal
from dataplane.edge.pipeline.parts import EdgeParts
from dataplane.edge.pipeline.record import RequestRecord
from dataplane.edge.router import Ticket
from dataplane.edge.sse import (
    DONE,
    SseSplitter,
    assemble,
    carries_output,
    error_event,
    is_error_event,
    usage_of_event,
)
from dataplane.edge.upstream import UpstreamError, UpstreamResponse
from dataplane.edge.writer import SSE_HEADERS, ResponseWriter, header_pairs

log = logging.getLogger("nimbus.edge")


def _plain_events(chunk: bytes, splitter: SseSplitter) -> bool:
    """True when the chunk is whole SSE events that carry neither usage nor an error, so it can be
    forwarded without being cut into events."""
    return (not splitter.pending and chunk.endswith(b"\n\n") and b'"usage":{' not in chunk
            and b'"usage": {' not in chunk and b'"error"' not in chunk)


def _ends_stream(chunk: bytes) -> bool:
    """A chunk of whole events that carries ``[DONE]`` (always the last event of a stream)."""
    return chunk.startswith(b"data: [DONE]") or chunk.endswith(b"data: [DONE]\n\n")


async def relay_stream(edge: EdgeParts, rec: RequestRecord, ticket: Ticket, resp: UpstreamResponse,
                       writer: ResponseWriter, fill: Callable[[bytes], None] | None = None) -> str | Failure:
    assert rec.req is not None
    req = rec.req
    metrics, release = edge.metrics, route.release
    # A stream that fills a response cache is kept as it goes out, to be added up into the
    # whole answer at its end (``sse.assemble``); it forgoes the socket fast path for that.
    sent: list[bytes] | None = [] if fill is not None else None
    labels = (req.model, ticket.replica.id, rec.priority)
    itl_hist = metrics.child(metrics.itl, *labels)
    splitter = SseSplitter()
    saw_done = False
    upstream_error = False
    failure: BaseException | None = None
    held: list[bytes] = []  # the role-only opening chunk, held until the first token exists
    last = 0.0
    write_now = writer.write_now
    load = edge.router.load(ticket.replica.id)

    def count_tokens(chunk: bytes) -> None:
        """Bookkeeping for a chunk of whole token events forwarded as is."""
        nonlocal last
        rec.chunks += chunk.count(b"\n\n")
        now = time.monotonic()
        itl_hist.observe(now - last)
        last = load.last_progress = now

    def forward_now(chunk: bytes) -> bool:
        """The upstream parser's sink once the response has started: whole plain token events
        go straight to the client's socket, without waking this task. Everything else ([DONE],
        usage, errors, partial events, a backed-up client) is refused and read below."""
        if not _plain_events(chunk, splitter) or _ends_stream(chunk):
            return False
        if rec.echo is not None:
            chunk = echo(chunk, rec.echo)
        if not write_now(chunk):
            return False
        count_tokens(chunk)
        return True

    try:
        async for chunk in resp.iter_chunks(edge.settings.stream_idle_timeout_s):
            if rec.response_started and _plain_events(chunk, splitter):
                # Whole events, no usage, no error: forward as is. With the sink installed only
                # a backed-up client or the stream's end brings such a chunk here.
                chunk = echo(chunk, rec.echo)
                count_tokens(chunk)
                saw_done = _ends_stream(chunk)
                if saw_done:
                    account.meter_stream_end(edge, rec, upstream_error)
                if sent is not None:
                    sent.append(chunk)
                await writer.write(chunk)
                if saw_done:
                    break
                continue
            out = held
            for event in splitter.feed(chunk):
                if event.startswith(b"data: [DONE]"):
                    saw_done = True
                    out.append(DONE)
                    continue
                usage, usage_only = usage_of_event(event)
                if usage is not None:
                    rec.usage = usage
                    if usage_only and not req.include_usage:
                        continue  # we asked for it for metering; the client did not
                elif is_error_event(event):
                    upstream_error = True
                else:
                    rec.chunks += 1
                out.append(echo(event, rec.echo))
            if not out:
                continue
            now = time.monotonic()
            if not rec.response_started:
                if not any(carries_output(ev) for ev in out):
                    held = out  # nothing generated yet: a failure now can still be retried elsewhere
                    continue
                held = []
                rec.ttft_ms = (now - rec.t0) * 1000
                metrics.child(metrics.ttft, *labels).observe(now - rec.t0)
                assert rec.variant is not None
                if not rec.dispatched_late:
                    # The autoscaler's TTFT judges the capacity requests meet on arrival. One that
                    # waited past its deadline restates a backlog the edge's queue depth already
                    # reported, and it arrives as that backlog drains: counted, it read as a breach
                    # once the burst was over (bench/fleet/README.md). Operators still see its TTFT.
                    edge.signals.ttft(rec.variant.served_model_name, now - rec.t0)
                edge.router.first_byte(ticket, now)
                writer.start_stream(200, SSE_HEADERS + header_pairs({**rec.rate_headers, "x-request-id": rec.request_id}))
                rec.response_started = True
                if sent is None:
                    resp.set_sink(forward_now)
            else:
                itl_hist.observe(now - last)
            last = load.last_progress = now
            if saw_done:
                account.meter_stream_end(edge, rec, upstream_error)
            body = b"".join(out)
            if sent is not None:
                sent.append(body)
            await writer.write(body)
            out.clear()
            if saw_done:
                break
    except (UpstreamError, TimeoutError, OSError) as exc:
        failure = exc
    resp.set_sink(None)  # whatever the engine still sends must not reach a finished response
    if not rec.response_started:
        metrics.child(metrics.errors, req.model, ticket.replica.id, "before_first_byte").inc()
        refused = next((engine_stream_refusal(ev) for ev in held if is_error_event(ev)), None)
        if refused is not None:  # the engine refused the request in an error event: a 4xx
            release(edge, rec, ticket, None)
            raise refused
        release(edge, rec, ticket, None)  # judged once another replica has had the request
        return Failure(ticket.replica.id, "broke")
    if saw_done and not upstream_error:
        release(edge, rec, ticket, True, route.engine_counted(rec.usage))
        rec.status, rec.http_status = "ok", 200
        writer.end()
        if sent is not None and fill is not None and (whole := assemble(b"".join(sent), rec.usage)) is not None:
            fill(whole)
        if not resp.complete:
            # The client is done; read the engine's end of body so the connection can be reused.
            with contextlib.suppress(UpstreamError, TimeoutError, OSError):
                async for _ in resp.iter_chunks(0.5):
                    pass
        return DONE_OK
    # Failed after the first byte: the client gets an error event and [DONE] now, never a hang.
    log.info("stream from replica %s broke: %r", ticket.replica.id, failure)
    metrics.child(metrics.errors, req.model, ticket.replica.id, "mid_stream").inc()
    release(edge, rec, ticket, False if not upstream_error else True)
    rec.status, rec.http_status = "error", 200
    tail = b"" if upstream_error else error_event("The model replica failed while streaming; please retry.")
    if not saw_done:
        tail += DONE
    account.meter(edge, rec)
    writer.end(tail)
    return DONE_ERROR
