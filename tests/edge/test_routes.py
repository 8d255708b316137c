"""The edge's one route table (``dataplane/edge/routes.py``): what ``app.py`` dispatches on, what
the early credential check reads, and where the engine serves each inference kind."""

from __future__ import annotations

import httpx

from dataplane.edge import routes
from dataplane.edge.app import EdgeApp
from dataplane.edge.validation import CHAT, COMPLETION, EMBEDDING
from tests.edge.conftest import make_key, standalone_config


def test_every_route_names_a_handler_of_the_app():
    table = [*routes.ROUTES.values(), *(route for _, route in routes.PREFIX_ROUTES)]
    missing = {route.handler for route in table if not callable(getattr(EdgeApp, route.handler, None))}
    assert not missing


def test_exact_paths_prefixes_and_the_engine_paths():
    assert routes.match("/v1/chat/completions") == (routes.ROUTES["/v1/chat/completions"], "")
    route, rest = routes.match("/v1/models/meta-llama/Llama-3.1-8B")
    assert route.handler == "retrieve_model" and rest == "meta-llama/Llama-3.1-8B"
    assert routes.match("/v1/models/") is None  # a prefix with nothing after it is not a route
    assert routes.match("/v1/chat") is None and routes.match("/nope") is None
    assert routes.ENGINE_PATHS == {CHAT: "/v1/chat/completions", COMPLETION: "/v1/completions",
                                   EMBEDDING: "/v1/embeddings"}
    # Big bodies are refused before they are read: the inference routes and file uploads.
    assert routes.CREDENTIALS_FIRST == {b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings",
                                        b"/v1/files"}


def test_unknown_paths_and_methods_get_openai_errors(edge_factory, sims):
    key = make_key("a")
    edge = edge_factory(standalone_config([s.url for s in sims], [{"name": "a", "keys": [{"dev_key": key}]}]),
                        redis_url="none")
    with httpx.Client(base_url=edge.url, headers={"authorization": f"Bearer {key}"}) as client:
        wrong = client.get("/v1/chat/completions")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        assert wrong.json()["error"]["code"] == "method_not_allowed"
        gone = client.get("/v1/nothing-here")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
        health = client.get("/health/models/demo")  # a prefix route: the rest is the model
        assert health.status_code == 200 and health.json()["model"] == "demo"
        assert client.get("/v1/models/demo").json()["id"] == "demo"
