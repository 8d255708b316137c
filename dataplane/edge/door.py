"""The edge's front door against hostile clients: the HTTP server's limits from the edge settings,
OpenAI-shaped answers for the errors the server gives itself, and a per-address throttle on
unauthenticated requests.

A request to an inference route is checked for credentials as soon as its head is complete, before
its body is read (``early``); without a valid key it gets 401 and never costs a body read, a JSON
decode or a queue slot. 401s per client address are a token bucket (``unauth_rate_per_s``,
``unauth_burst``); past it such requests get 429 with ``Retry-After`` instead.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from dataplane import httpserver
from dataplane.edge import errors
from dataplane.edge.auth import authenticate, is_internal
from dataplane.edge.settings import EdgeSettings

_CODES = {400: "invalid_request", 408: "request_timeout", 413: "request_too_large", 414: "url_too_long",
          431: "headers_too_large", 503: "too_many_connections"}


def render_error(status: int, message: str) -> tuple[bytes, bytes]:
    """The server's own error answers (400, 408, 414, 431, 503) in OpenAI's shape."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return httpserver.JSON_TYPE, errors.error_body(message[:1].upper() + message[1:] + ".", kind,
                                                   _CODES.get(status, "invalid_request"))


class AddressThrottle:
    """Token bucket per client address, bounded in addresses (least recently seen dropped first)."""

    def __init__(self, rate_per_s: float, burst: int, max_addresses: int = 65536,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.max_addresses = max_addresses
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # addr -> (tokens, at)

    def spend(self, address: str) -> float:
        """Spend one token; returns 0.0 if there was one, else the seconds until there is."""
        now = self.clock()
        tokens, at = self._buckets.pop(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate if self.rate > 0 else 60.0
        self._buckets[address] = (tokens, now)
        while len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)
        return wait


def connection_caps(settings: EdgeSettings, fd_limit: int) -> tuple[int, int]:
    """(total, per client address) from the settings, with their fd-derived defaults."""
    total = settings.max_connections or max(64, (fd_limit - 256) // 2)
    per_client = settings.max_connections_per_client or max(16, total // 4)
    return total, per_client


def server_options(settings: EdgeSettings, early: Callable | None, fd_limit: int) -> httpserver.ServerOptions:
    limit = settings.max_body_bytes
    too_large = errors.EdgeError(413, f"Request body is larger than {limit} bytes.", code="request_too_large")
    total, per_client = connection_caps(settings, fd_limit)
    return httpserver.ServerOptions(
        max_body=limit, body_limits=((b"/v1/files", max(limit, settings.max_file_upload_bytes),
                                      max(settings.body_timeout_s, settings.file_upload_timeout_s)),),
        too_large_type=httpserver.JSON_TYPE, too_large_body=too_large.body(),
        render_error=render_error, keep_alive_s=settings.keep_alive_s, header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s, send_timeout_s=settings.send_timeout_s or None,
        max_header_bytes=settings.max_header_bytes, max_headers=settings.max_headers,
        max_connections=total, max_connections_per_client=per_client, early=early)


def authentication_error(exc: errors.EdgeError, throttle: AddressThrottle, address: str) -> errors.EdgeError:
    """A 401 as it goes out: counted against the address, and a 429 once the address is past its rate."""
    if exc.status != 401:
        return exc
    wait = throttle.spend(address)
    if wait <= 0:
        return exc
    return errors.EdgeError(429, "Too many unauthenticated requests from this address; retry later.",
                            type="rate_limit_error", code="too_many_auth_failures",
                            headers={"retry-after": str(max(1, round(wait + 0.5)))})


class CredentialCheck:
    """The early check: the error a request's credentials get, or None (valid, or no snapshot yet:
    the handler answers that one). Header values that passed against the current snapshot are
    remembered until the next snapshot, so a valid key costs one set lookup here; the service
    still authenticates every request itself (expiry included)."""

    def __init__(self, get_catalog: Callable, max_entries: int = 4096, edge_token: str = "") -> None:
        self._get_catalog = get_catalog
        self.edge_token = edge_token  # the batch runner's credential: the service checks the rest
        self._catalog = None
        self._passed: set[bytes] = set()
        self.max_entries = max_entries

    def passed(self, authorization: bytes | None) -> bool:
        """This header value passed against the snapshot in use (no look-up beyond a set's)."""
        return authorization in self._passed and self._catalog is self._get_catalog()

    def __call__(self, authorization: bytes | None) -> errors.EdgeError | None:
        catalog = self._get_catalog()
        if catalog is None:
            return None
        if catalog is not self._catalog:
            self._catalog, self._passed = catalog, set()
        if authorization in self._passed or is_internal(authorization, self.edge_token):
            return None
        try:
            authenticate(catalog, authorization.decode("latin-1") if authorization else None)
        except errors.EdgeError as exc:
            return exc
        if len(self._passed) >= self.max_entries:
            self._passed.clear()
        self._passed.add(authorization)
        return None
