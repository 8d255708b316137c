"""One error body for the REST APIs: RFC 9457 problem details (application/problem+json)."""

from __future__ import annotations

import logging
import re

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import ClientException, HTTPException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from sqlalchemy.exc import DataError, IntegrityError

from controlplane.schemas.common import FieldProblem, ProblemDetail
from controlplane.services.errors import ServiceError

log = logging.getLogger("nimbus.api")
PROBLEM_JSON = "application/problem+json"

_TITLES = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found", 405: "Method not allowed",
           409: "Conflict", 413: "Payload too large", 415: "Unsupported media type", 422: "Unprocessable content",
           429: "Too many requests", 500: "Internal server error", 503: "Service unavailable"}


def problem(request: Request, status: int, detail: str, errors: list[FieldProblem] | None = None,
            title: str | None = None, headers: dict[str, str] | None = None) -> Response:
    body = ProblemDetail(
        type=f"https://nimbus.dev/problems/{status}",
        title=title or _TITLES.get(status, "Error"),
        status=status,
        detail=detail,
        instance=request.url.path,
        errors=errors or [],
    )
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="nimbus"'}
    return Response(content=msgspec.json.encode(body), status_code=status, media_type=PROBLEM_JSON, headers=headers)


_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")


def _validation_errors(exc: ValidationException) -> list[FieldProblem]:
    out = []
    for item in exc.extra or []:
        if isinstance(item, dict):
            field = str(item.get("key") or item.get("source") or "body")
            message = str(item.get("message", "invalid value"))
            # msgspec names an unknown field only in its message; the problem should name it too.
            if (unknown := _UNKNOWN_FIELD.search(message)) and field in ("data", "body"):
                field = unknown.group(1)
            elif field == "data":
                field = "body"
            out.append(FieldProblem(field=field, message=message))
    return out


def handle_validation(request: Request, exc: ValidationException) -> Response:
    return problem(request, 400, "request did not validate", _validation_errors(exc) or None)


def handle_http(request: Request, exc: HTTPException) -> Response:
    errors = None
    if isinstance(exc, ClientException) and exc.status_code == 400 and not exc.extra:
        # Litestar's own 400s here are bodies that do not decode (truncated, not JSON, bad UTF-8).
        errors = [FieldProblem(field="body", message=str(exc.detail))]
    return problem(request, exc.status_code, str(exc.detail), errors, headers=exc.headers)


def handle_service(request: Request, exc: ServiceError) -> Response:
    return problem(request, exc.status, exc.detail, [FieldProblem(e.field, e.message) for e in exc.errors],
                   title=exc.title, headers=getattr(exc, "headers", None))


def handle_integrity(request: Request, exc: IntegrityError) -> Response:
    # A race between two writers on a unique key; the loser gets a clean 409.
    log.info("integrity error on %s: %s", request.url.path, exc.orig.__class__.__name__)
    return problem(request, 409, "conflicts with existing data")


def handle_data_error(request: Request, exc: DataError) -> Response:
    # Values the database cannot store (NUL bytes in text, out-of-range numbers) are client errors.
    return problem(request, 400, "a value in the request cannot be stored (e.g. a NUL byte or an out-of-range number)")


def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem(request, HTTP_500_INTERNAL_SERVER_ERROR, "internal error; it has been logged")


EXCEPTION_HANDLERS = {
    ValidationException: handle_validation,
    ServiceError: handle_service,
    IntegrityError: handle_integrity,
    DataError: handle_data_error,
    HTTPException: handle_http,
    Exception: handle_unexpected,
}

__all__ = ["EXCEPTION_HANDLERS", "PROBLEM_JSON", "MediaType", "problem"]
