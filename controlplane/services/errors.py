"""Errors the service layer raises; the API turns each into an RFC 9457 problem response."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class FieldError:
    field: str
    message: str


@dataclass
class ServiceError(Exception):
    detail: str
    errors: list[FieldError] = field(default_factory=list)
    status: int = 400
    title: str = "Bad request"

    def __str__(self) -> str:
        return self.detail


class NotFound(ServiceError):
    def __init__(self, what: str, ident: object = None) -> None:
        super().__init__(f"{what} not found" + (f": {ident}" if ident is not None else ""), [], 404, "Not found")


class Conflict(ServiceError):
    def __init__(self, detail: str, errors: list[FieldError] | None = None) -> None:
        super().__init__(detail, errors or [], 409, "Conflict")


class Invalid(ServiceError):
    def __init__(self, detail: str, errors: list[FieldError] | None = None) -> None:
        super().__init__(detail, errors or [], 422, "Unprocessable content")


class Unauthorized(ServiceError):
    def __init__(self, detail: str = "missing or invalid credentials") -> None:
        super().__init__(detail, [], 401, "Unauthorized")


class Forbidden(ServiceError):
    def __init__(self, detail: str) -> None:
        super().__init__(detail, [], 403, "Forbidden")


class TooManyAttempts(ServiceError):
    """429: sign-in throttling (``retry_after_s`` becomes the Retry-After header)."""

    def __init__(self, detail: str, retry_after_s: float) -> None:
        super().__init__(detail, [], 429, "Too many requests")
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class Unavailable(ServiceError):
    def __init__(self, detail: str) -> None:
        super().__init__(detail, [], 503, "Service unavailable")
