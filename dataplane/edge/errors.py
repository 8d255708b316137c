"""OpenAI-style errors. The status codes are the ones the ``openai`` SDK maps to its exception classes:
400 BadRequestError, 401 AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError,
429 RateLimitError, 5xx InternalServerError."""

from __future__ import annotations

import msgspec


class EdgeError(Exception):
    """An error the edge answers itself, before or instead of proxying."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> bytes:
    return msgspec.json.encode({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> EdgeError:
    return EdgeError(400, message, param=param, code=code)


def unauthorized(message: str = "Invalid API key.") -> EdgeError:
    return EdgeError(401, message, type="authentication_error", code="invalid_api_key")


def forbidden(message: str, code: str = "forbidden") -> EdgeError:
    return EdgeError(403, message, type="permission_error", code=code)


def model_not_found(model: str) -> EdgeError:
    return EdgeError(
        404, f"The model `{model}` does not exist or you do not have access to it.",
        code="model_not_found", param="model",
    )


def unavailable(message: str, retry_after_s: float, code: str = "overloaded") -> EdgeError:
    return EdgeError(
        503, message, type="server_error", code=code,
        headers={"retry-after": str(max(1, round(retry_after_s)))},
    )


def upstream_failed(message: str = "The model replica failed before answering.") -> EdgeError:
    return EdgeError(502, message, type="server_error", code="upstream_error")
