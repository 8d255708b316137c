"""``/v1/files`` and ``/v1/batches``: the OpenAI Files and Batch API, answered by the control plane.

The edge authenticates the key here, as it does for inference (the snapshot is the one place keys
are checked), then forwards the call to the control plane's ``/internal/v1/openai`` with the edge
token and the caller's tenant and key, and passes the answer back as it came. Batch lines come back
to the edge as inference requests of the batch runner (``auth.batch_caller``) at batch priority.
An unreachable control plane costs only these routes: a 503 in OpenAI's shape, inference unaffected.
"""

from __future__ import annotations

import logging

import aiohttp

from dataplane import httpserver
from dataplane.edge import errors
from dataplane.edge.auth import authenticate
from dataplane.edge.catalog import Catalog

log = logging.getLogger("nimbus.edge.batch_api")

_METHODS = {"GET", "POST", "DELETE"}
_PASSED_HEADERS = ("content-type",)


class BatchApiForwarder:
    def __init__(self, control_plane_url: str | None, edge_token: str, timeout_s: float = 300.0) -> None:
        self.base_url = control_plane_url.rstrip("/") if control_plane_url else None
        self.edge_token = edge_token
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=10.0)
        self._session: aiohttp.ClientSession | None = None

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(self, catalog: Catalog | None, request: httpserver.Request) -> tuple[int, bytes, bytes]:
        """(status, content type, body) for the client."""
        if catalog is None:
            raise errors.unavailable("The edge has no snapshot yet; retry shortly.", 2.0, code="not_ready")
        auth = request.headers.get(b"authorization")
        tenant, key = authenticate(catalog, auth.decode("latin-1") if auth else None)
        if request.method not in _METHODS:
            raise errors.EdgeError(405, f"{request.method} is not allowed here.", code="method_not_allowed")
        if self.base_url is None:
            raise errors.EdgeError(404, "The Batch API needs the control plane; this edge runs without one.",
                                   code="not_found")
        headers = {"authorization": f"Bearer {self.edge_token}", "x-nimbus-tenant-id": tenant.id,
                   "x-nimbus-key-id": key.id}
        for name in _PASSED_HEADERS:
            if (value := request.headers.get(name.encode())) is not None:
                headers[name] = value.decode("latin-1")
        url = f"{self.base_url}/internal/v1/openai{request.path[len('/v1'):]}"
        if request.query:
            url += "?" + request.query.decode("latin-1")
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self._session.request(request.method, url, data=request.body or None,
                                             headers=headers) as response:
                body = await response.read()
                kind = response.headers.get("content-type", "application/json").encode("latin-1")
                if response.status >= 500 or (response.status in (401, 403) and b"problem" in kind):
                    # The control plane's own failure (or its refusal of the edge token) is not the
                    # tenant's to read: log it, and answer in OpenAI's shape.
                    log.warning("batch API %s %s: control plane answered %d: %s", request.method, request.path,
                                response.status, body[:300])
                    raise errors.unavailable("The Batch API is unavailable; retry shortly.", 5.0,
                                             code="batch_api_unavailable")
                return response.status, kind, body
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("batch API %s %s: control plane unreachable: %s", request.method, request.path, exc)
            raise errors.unavailable("The Batch API is unavailable; retry shortly.", 5.0,
                                     code="batch_api_unavailable") from None
