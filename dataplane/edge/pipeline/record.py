"""The one record a request carries through the pipeline: who sent it, what it asks, where it
went, and what came back (what ``account`` meters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dataplane.edge.catalog import INTERACTIVE, ApiKey, Replica, Tenant, Variant
from dataplane.edge.limits import Lease
from dataplane.edge.router import Ticket
from dataplane.edge.validation import InferenceRequest


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    t0: float
    ts: float
    tenant: Tenant | None = None
    key: ApiKey | None = None
    variant: Variant | None = None
    model: str = ""
    priority: str = INTERACTIVE
    req: InferenceRequest | None = None
    lease: Lease | None = None
    ticket: Ticket | None = None
    rate_headers: dict[str, str] = field(default_factory=dict)
    response_started: bool = False
    queue_ms: float | None = None
    # It left the queue past the last moment it could meet its TTFT SLO (admit.dispatch_deadline).
    dispatched_late: bool = False
    ttft_ms: float | None = None
    status: str = "error"
    http_status: int = 500
    usage: dict[str, Any] | None = None
    chunks: int = 0
    replica: Replica | None = None
    error_code: str | None = None
    metered: bool = False  # its usage event is in the spool (written before the response's last bytes)
    echo: tuple[bytes, bytes] | None = None  # served -> requested model name in the answer (echo.py)
    batch_line: bool = False  # sent by the batch runner, under the line's own request id
    cache: str | None = None  # "hit" / "semantic" when answered from a cache (metered as a cached response)
