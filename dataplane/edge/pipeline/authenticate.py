"""Stage 1: who is calling. A tenant's API key, or the control plane's batch runner sending one
line of a tenant's batch under that line's own request id."""

from __future__ import annotations

from collections.abc import Mapping

from dataplane.edge.auth import authenticate, batch_caller
from dataplane.edge.catalog import Catalog
from dataplane.edge.pipeline.record import RequestRecord


def authenticate_request(catalog: Catalog, rec: RequestRecord, headers: Mapping[str, str], edge_token: str) -> None:
    batch = batch_caller(catalog, headers, edge_token)
    if batch is not None:
        rec.tenant, rec.key, rec.request_id = batch
        rec.batch_line = True
    else:
        rec.tenant, rec.key = authenticate(catalog, headers.get("authorization"))
