"""Request bodies: size and nesting-depth limits, checked before anything decodes a JSON body.

Litestar runs a route's guards first, then reads and decodes ``data``, then resolves the other
dependencies. So authentication lives in guards (``api.deps``), and this request class makes
``Request.json()`` refuse a body nested deeper than :data:`MAX_JSON_DEPTH` with a 400 before
msgspec sees it (msgspec itself raises ``RecursionError`` near 1,000 levels, which used to be a
500). Sizes are capped by Litestar's ``request_max_body_size`` (413 before the body is read when
``Content-Length`` says so, else as soon as the streamed bytes pass it): :data:`MAX_BODY_BYTES`
app-wide, less on the agents' routes, more on the catalog import.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

from litestar import Request
from litestar.exceptions import ValidationException
from litestar.serialization import decode_json
from litestar.types import Empty

# Our deepest schema (catalog import: clouds → regions → zones/instance types → fields) is under
# 10 levels; 32 leaves room for free-form dicts (agent metrics, engine_args) and keeps the check cheap.
MAX_JSON_DEPTH = 32
MAX_BODY_BYTES = 1024 * 1024  # every JSON API body but the catalog import
CATALOG_MAX_BODY_BYTES = 8 * 1024 * 1024  # Terraform's cloud catalog for many regions and types
AGENT_MAX_BODY_BYTES = 256 * 1024  # register/heartbeat: a node's facts and ≤ 8 replicas' reports

# A JSON string (escapes included); its contents may hold brackets that are not structure.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_KEEP = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _KEEP)
_DELTA = [0] * 256
_DELTA[ord("[")] = _DELTA[ord("{")] = 1
_DELTA[ord("]")] = _DELTA[ord("}")] = -1


class BodyTooDeep(ValidationException):
    """400, with the problem naming the field ``body``."""


def json_depth_exceeds(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text nests arrays/objects deeper than ``limit``.

    Linear and done in C-level primitives (regex, translate, accumulate): strings are blanked so
    brackets inside them do not count, the rest is reduced to its brackets, and a running sum
    gives the depth. A malformed body may be judged too deep; it would fail to decode anyway.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # cannot nest deeper than it has openers
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= limit:
        return False
    return max(accumulate(_DELTA[b] for b in brackets)) > limit


def check_json_body(body: bytes) -> None:
    if json_depth_exceeds(body):
        raise BodyTooDeep(
            f"JSON body nested deeper than {MAX_JSON_DEPTH} levels",
            extra=[{"key": "body", "message": f"nested deeper than {MAX_JSON_DEPTH} levels"}],
        )


class NimbusRequest(Request):
    """``Request`` whose JSON decoding enforces the depth limit first (the app's ``request_class``)."""

    async def json(self) -> Any:
        if self._json is Empty and self._connection_state.json is Empty:
            body = await self.body()
            check_json_body(body)
            try:
                self._json = self._connection_state.json = decode_json(
                    body or b"null", type_decoders=self.route_handler.resolve_type_decoders()
                )
            except RecursionError as exc:  # unreachable below the limit; never a 500 if it were
                raise BodyTooDeep("JSON body nested too deeply", extra=[{"key": "body", "message": "nested too deeply"}]) from exc
        return await super().json()

