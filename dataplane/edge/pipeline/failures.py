"""What a failed attempt says, and whose fault it was.

An attempt that fails before the client sees a byte may be tried once more on another replica.
Whether the first replica is blamed (its breaker counts it) depends on the second: a failure
repeated the same way on two replicas is the request's doing; one another replica did not repeat
was the first replica's own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import msgspec

from dataplane.edge import errors
from dataplane.edge.breaker import OPEN
from dataplane.edge.pipeline.parts import EdgeParts
from dataplane.edge.pipeline.record import RequestRecord

log = logging.getLogger("nimbus.edge")

# Outcomes of one attempt that the client saw (else a ``Failure``).
DONE_OK, DONE_ERROR = "ok", "error"
# Engine statuses that say "not now" about the replica, never "this request is bad".
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


@dataclass(slots=True)
class Failure:
    """One attempt that failed before the client saw a byte.

    ``charged``: already counted against the replica's breaker (it could not be reached, or did
    not answer in time: nothing the request's content did). Any other failure (an engine 5xx, a
    reset or broken body after the request went out) might be the request's own doing; it is
    counted only once another replica served the same request, and not at all if another replica
    fails the same way (then the request is at fault, and the client is told so)."""

    replica_id: str
    kind: str  # "connect" | "timeout" | "http" | "broke"
    status: int = 0
    detail: bytes = b""
    charged: bool = False

    def same_as(self, other: Failure) -> bool:
        return not self.charged and not other.charged and (self.kind, self.status) == (other.kind, other.status)


def charge(edge: EdgeParts, failure: Failure) -> None:
    """The failure was the replica's: its breaker hears of it (once)."""
    if not failure.charged:
        failure.charged = True
        breaker = edge.router.breaker(failure.replica_id)
        breaker.on_failure(time.monotonic())
        edge.metrics.child(edge.metrics.breaker_open, failure.replica_id).set(1 if breaker.state == OPEN else 0)


def judge(edge: EdgeParts, rec: RequestRecord, first: Failure, second: Failure) -> errors.EdgeError:
    """Two replicas failed the same request before the first byte."""
    assert rec.req is not None
    metrics = edge.metrics
    if first.same_as(second):
        # The same failure on a second replica: the request did it. No breaker hears of it, and
        # it is not tried a third time.
        if second.kind == "http" and second.status in UNAVAILABLE_STATUSES:
            metrics.child(metrics.poison, rec.req.model, "unavailable").inc()
            return errors.unavailable("The model's replicas are not taking requests right now.", 2.0,
                                      code="engine_unavailable")
        metrics.child(metrics.poison, rec.req.model, f"{second.kind}_{second.status}").inc()
        log.info("request %s failed the same way on replicas %s and %s (%s %s): the request's fault",
                 rec.request_id, first.replica_id, second.replica_id, second.kind, second.status)
        return errors.EdgeError(
            422, "The model engine failed on this request on two replicas; it cannot be processed as sent. "
                 "Check its parameters.", code="engine_rejected_request")
    if not first.charged and not second.charged:  # two different failures: each replica's own
        charge(edge, first)
        charge(edge, second)
    # Else one replica was unreachable (charged already), which says nothing about the other's failure.
    return errors.upstream_failed()


def unverified(failure: Failure) -> errors.EdgeError:
    """One failure and no second replica to tell a bad replica from a bad request: blame nobody."""
    if failure.kind == "http" and failure.status in UNAVAILABLE_STATUSES:
        return errors.unavailable("The model replica is not taking requests right now.", 2.0,
                                  code="engine_unavailable")
    return errors.upstream_failed()


def _engine_message(data: bytes) -> str:
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        obj = None
    message = None
    if isinstance(obj, dict):
        inner = obj.get("error") if isinstance(obj.get("error"), dict) else obj
        message = inner.get("message") or inner.get("detail")
    if not isinstance(message, str) or not message:
        message = data[:500].decode("utf-8", "replace").strip() or "The model engine refused the request."
    return message[:2000]


def engine_client_error(status: int, data: bytes) -> errors.EdgeError:
    """An engine's 4xx as the client gets it: OpenAI's error shape; 413 and 422 kept, 429 as a rate
    limit, any other 4xx a 400."""
    message = _engine_message(data)
    if status == 429:
        return errors.EdgeError(429, message, type="rate_limit_error", code="engine_overloaded",
                                headers={"retry-after": "1"})
    return errors.EdgeError(status if status in (413, 422) else 400, message, code="engine_rejected_request")


def engine_stream_refusal(event: bytes) -> errors.EdgeError | None:
    """An engine's error event before any output, as a 4xx, if it says it is one."""
    try:
        obj = msgspec.json.decode(event[event.index(b"{"):])
    except (ValueError, msgspec.DecodeError, RecursionError):
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict):
        return None
    code = err.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else 0
    if 400 <= status < 500:
        return engine_client_error(status, msgspec.json.encode(obj))
    return None
