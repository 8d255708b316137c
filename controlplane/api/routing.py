"""Route decorators that document the problem-details error responses on every operation,
so the OpenAPI schema tells clients (and schemathesis) every status they can receive."""

from __future__ import annotations

import functools

import litestar
from litestar.openapi.datastructures import ResponseSpec

from controlplane.schemas.common import ProblemDetail


def _spec(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=ProblemDetail, description=description, media_type="application/problem+json")


ERROR_RESPONSES = {
    400: _spec("The request did not validate"),
    401: _spec("Missing, invalid, revoked or expired credentials"),
    403: _spec("Authenticated but not allowed (suspended tenant, missing scope)"),
    404: _spec("No such resource (or not yours)"),
    409: _spec("Conflicts with existing data"),
    413: _spec("The request body is larger than this route accepts"),
    422: _spec("Well-formed but semantically invalid"),
    429: _spec("Too many failed sign-in attempts from this address (see Retry-After)"),
}

get = functools.partial(litestar.get, responses=ERROR_RESPONSES)
post = functools.partial(litestar.post, responses=ERROR_RESPONSES)
put = functools.partial(litestar.put, responses=ERROR_RESPONSES)
patch = functools.partial(litestar.patch, responses=ERROR_RESPONSES)
delete = functools.partial(litestar.delete, responses=ERROR_RESPONSES)
