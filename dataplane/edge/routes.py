"""Every path the edge answers, in one table.

``app.py`` dispatches on it, its early credential check (before a body is read) reads which
routes want credentials first, and the inference pipeline reads where an engine serves each
request kind. A new endpoint is one entry here plus the ``EdgeApp`` handler it names.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.edge.validation import CHAT, COMPLETION, EMBEDDING

GET = frozenset({"GET"})
POST = frozenset({"POST"})
ANY = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class Route:
    handler: str  # the EdgeApp method that answers it
    methods: frozenset[str]
    kind: str | None = None  # an inference route: the request kind, and the same path on the engine
    credentials_first: bool = False  # refused before its body is read when the key is bad (big bodies)


# Exact paths.
ROUTES: dict[str, Route] = {
    "/v1/chat/completions": Route("inference", POST, kind=CHAT, credentials_first=True),
    "/v1/completions": Route("inference", POST, kind=COMPLETION, credentials_first=True),
    "/v1/embeddings": Route("inference", POST, kind=EMBEDDING, credentials_first=True),
    "/v1/models": Route("list_models", GET),
    # The Batch API is the control plane's; the forwarder checks its methods after the key, so a
    # caller without credentials learns nothing about them.
    "/v1/files": Route("batch_api", ANY, credentials_first=True),  # uploads: refused before 100 MiB
    "/v1/batches": Route("batch_api", ANY),
    "/health": Route("health", ANY),
    "/health/ready": Route("region_health", GET),
    "/ready": Route("ready", ANY),
    "/metrics": Route("metrics", ANY),
}

# Paths under a prefix: the handler gets the rest of the path (a model id, a file id).
PREFIX_ROUTES: tuple[tuple[str, Route], ...] = (
    ("/v1/models/", Route("retrieve_model", GET)),
    ("/v1/files/", Route("batch_api", ANY)),
    ("/v1/batches/", Route("batch_api", ANY)),
    ("/health/models/", Route("model_health", GET)),
)

# Where the engine serves each inference kind: the same OpenAI path.
ENGINE_PATHS: dict[str, str] = {route.kind: path for path, route in ROUTES.items() if route.kind is not None}
CREDENTIALS_FIRST: frozenset[bytes] = frozenset(path.encode() for path, route in ROUTES.items()
                                                if route.credentials_first)


def match(path: str) -> tuple[Route, str] | None:
    """The route for ``path`` and what follows its prefix ("" for an exact path), or None."""
    route = ROUTES.get(path)
    if route is not None:
        return route, ""
    for prefix, route in PREFIX_ROUTES:
        if path.startswith(prefix) and len(path) > len(prefix):
            return route, path[len(prefix):]
    return None
