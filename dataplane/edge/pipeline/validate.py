"""Stage 2: what is asked. The body parsed within its bounds, checked against the OpenAI API,
and the request's priority class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dataplane.edge.catalog import BATCH, INTERACTIVE, ApiKey
from dataplane.edge.pipeline.parts import EdgeParts
from dataplane.edge.pipeline.record import RequestRecord
from dataplane.edge.validation import InferenceRequest, parse_json, validate


def validate_request(edge: EdgeParts, rec: RequestRecord, kind: str, headers: Mapping[str, str],
                     raw: bytes) -> dict[str, Any]:
    """Fills ``rec.req``; returns the parsed body (the caches key on it)."""
    s = edge.settings
    body = parse_json(raw, s.max_body_bytes, s.max_json_depth)
    req = validate(kind, body, edge.estimator, max_messages=s.max_messages, max_n=s.max_n,
                   extra_fields=edge.extra_fields)
    rec.req, rec.model = req, req.model
    assert rec.key is not None
    rec.priority = BATCH if rec.batch_line else request_priority(rec.key, req, headers)
    return body


def request_priority(key: ApiKey, req: InferenceRequest, headers: Mapping[str, str]) -> str:
    """Per request (body ``priority`` or ``x-nimbus-priority``) or else per key; a batch key
    cannot promote itself to interactive."""
    asked = req.priority or headers.get("x-nimbus-priority")
    if key.priority == BATCH:
        return BATCH
    return asked if asked in (INTERACTIVE, BATCH) else key.priority
