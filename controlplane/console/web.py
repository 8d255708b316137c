"""Shared plumbing for console pages: rendering, security headers and error pages."""

from __future__ import annotations

import secrets
from typing import Any

from litestar import Request, Response
from litestar.response import Redirect, Template

from controlplane.console import sessions
from controlplane.console.auth import CsrfRejected, SignInRequired
from controlplane.services.errors import ServiceError

# Pages carry per-session tokens and, once, a new key's secret: never cache them anywhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def add_security_headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def page(template: str, live: sessions.Live | None, status_code: int = 200, **context: Any) -> Template:
    return Template(
        template_name=template, status_code=status_code,
        # Templates get a flag, never the session object (it carries the browser's token).
        context={"csrf": live.row.csrf_token if live else "", "live": live is not None, **context},
    )


def login_page(template: str, status_code: int = 200, headers: dict[str, str] | None = None,
               **context: Any) -> Template:
    """A sign-in form with a fresh double-submit token (cookie + hidden field)."""
    token = secrets.token_urlsafe(24)
    return Template(
        template_name=template, status_code=status_code, context={"login_csrf": token, "live": None, **context},
        cookies=[sessions.cookie(sessions.LOGIN_CSRF_COOKIE, token, 3600)], headers=headers,
    )


def redirect(path: str, **kw: Any) -> Redirect:
    return Redirect(path=path, status_code=303, **kw)


def _sign_in_required(_request: Request, exc: SignInRequired) -> Response:
    return add_security_headers(redirect(exc.login_path))


def _csrf_rejected(request: Request, _exc: CsrfRejected) -> Response:
    return _error_page(request, 403, "Request rejected",
                       "This form was not sent from this console page (its CSRF token is missing or wrong). "
                       "Reload the page and try again.")


def _error_page(request: Request, status: int, title: str, message: str) -> Response:
    return Template(
        template_name="error.html", status_code=status,
        context={"live": None, "csrf": "", "title": title, "message": message,
                 "operator": request.url.path.startswith("/console/admin")},
        headers=SECURITY_HEADERS,
    )


def _service_error(request: Request, exc: ServiceError) -> Response:
    return _error_page(request, exc.status, exc.title, exc.detail)


EXCEPTION_HANDLERS = {
    SignInRequired: _sign_in_required,
    CsrfRejected: _csrf_rejected,
    ServiceError: _service_error,
}
