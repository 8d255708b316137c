"""Hostile bodies at every JSON door of the control plane: deep nesting is a 400 naming ``body``
(never a 500), oversized bodies are 413, callers without valid credentials get 401 before their
body is read at all, and type errors name the field."""

from __future__ import annotations

import json
import socket
import time
import uuid

import httpx
import pytest
from litestar.testing import AsyncTestClient

from controlplane.api.app import create_app
from controlplane.api.bodies import (
    AGENT_MAX_BODY_BYTES,
    CATALOG_MAX_BODY_BYTES,
    MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    json_depth_exceeds,
)
from tests.controlplane import factories
from tests.controlplane.conftest import ADMIN_TOKEN, EDGE_TOKEN, isolated_throttle
from tests.live_server import serve

JSON = {"content-type": "application/json"}


def nested(depth: int, kind: str = "array") -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def test_depth_scanner() -> None:
    assert not json_depth_exceeds(nested(MAX_JSON_DEPTH))
    assert json_depth_exceeds(nested(MAX_JSON_DEPTH + 1))
    assert json_depth_exceeds(nested(MAX_JSON_DEPTH + 1, "object"))
    # Brackets inside strings (escaped quotes included) are not structure.
    fake = '"' + '[{\\"' * 500 + '"'
    assert not json_depth_exceeds(f'{{"a": [{fake}, "]]]]", {{"b": {fake}}}]}}'.encode())
    # Wide is fine, deep is not, however it is spread.
    assert not json_depth_exceeds(b"[" + b"[[1]]," * 100_000 + b"1]")
    assert json_depth_exceeds(b'{"x": [1, 2, ' + nested(40) + b"]}")
    # Linear: a worst-case 1 MiB body is scanned well under a second even on a loaded machine.
    worst = b"[" + b'["\\"[",[[]]],' * (MAX_BODY_BYTES // 16) + b"1]"
    started = time.perf_counter()
    assert not json_depth_exceeds(worst)
    assert time.perf_counter() - started < 1.0


async def _tenant_key(client: AsyncTestClient, admin: dict) -> str:
    tenant = (await client.post("/admin/v1/tenants", json={"name": factories.unique("deep")}, headers=admin)).json()
    created = await client.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={"scopes": ["manage"]}, headers=admin)
    return created.json()["secret"]


async def _doors(client: AsyncTestClient, admin: dict) -> list[tuple[str, str, dict]]:
    """Every JSON-body route, with credentials that get it past authentication."""
    tenant_auth = {"Authorization": f"Bearer {await _tenant_key(client, admin)}"}
    edge = {"Authorization": f"Bearer {EDGE_TOKEN}"}
    some = uuid.uuid4()
    return [
        ("POST", "/admin/v1/tenants", admin), ("PATCH", f"/admin/v1/tenants/{some}", admin),
        ("POST", f"/admin/v1/tenants/{some}/keys", admin), ("POST", "/admin/v1/models", admin),
        ("PATCH", f"/admin/v1/models/{some}", admin), ("POST", f"/admin/v1/models/{some}/variants", admin),
        ("POST", "/admin/v1/pools", admin), ("PATCH", f"/admin/v1/pools/{some}", admin),
        ("POST", "/admin/v1/catalog/import", admin), ("POST", f"/admin/v1/nodes/{some}/drain", admin),
        ("POST", "/v1/tenant/keys", tenant_auth),
        ("POST", "/internal/v1/edge/activate", edge),
        ("POST", "/internal/v1/agents/register", {}),  # the token travels in the body
    ]


@pytest.mark.parametrize("depth,kind", [(MAX_JSON_DEPTH + 1, "array"), (1_000, "object"), (100_000, "array")])
async def test_deep_bodies_are_400_naming_body_on_every_door(client, admin, depth, kind) -> None:
    for method, path, headers in await _doors(client, admin):
        r = await client.request(method, path, content=nested(depth, kind), headers={**JSON, **headers})
        assert r.status_code == 400, (method, path, r.status_code, r.text[:300])
        problem = r.json()
        assert problem["errors"] == [{"field": "body", "message": f"nested deeper than {MAX_JSON_DEPTH} levels"}]
        assert r.headers["content-type"].startswith("application/problem+json")


async def test_deep_value_inside_a_valid_field_is_refused_too(client, admin) -> None:
    body = json.dumps({"name": "x", "metadata": {"k": 1}})[:-1] + ', "labels": ' + nested(60).decode() + "}"
    r = await client.post("/admin/v1/tenants", content=body.encode(), headers={**JSON, **admin})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "body"
    # At the limit the catalog import (a free-form dict) decodes and answers from its schema check.
    catalog = factories.catalog()
    catalog["extra"] = json.loads(nested(MAX_JSON_DEPTH - 1, "object"))
    r = await client.post("/admin/v1/catalog/import", json=catalog, headers=admin)
    assert r.status_code in (200, 422), r.text[:300]


def _raw(url: str, path: str, auth: str | None, *, wait_s: float) -> bytes:
    """Sends a POST's headers announcing a 200 kB body, and never the body; returns what came back
    within ``wait_s`` (nothing if the server is waiting for the body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: 200000\r\n" + (f"Authorization: {auth}\r\n" if auth else "") + "\r\n")
        sock.sendall(head.encode())
        try:
            return sock.recv(65536)
        except TimeoutError:
            return b""


def test_unauthenticated_bodies_are_never_read(settings) -> None:
    """Over a real socket: a caller without valid credentials gets its 401 while the body it
    announced is still unsent, so the server never waited for (read, decoded) it. The control
    case shows the probe works: with valid credentials the server does wait for the body."""
    doors = ["/admin/v1/tenants", "/admin/v1/catalog/import", "/v1/tenant/keys", "/internal/v1/edge/activate",
             "/internal/v1/agents/heartbeat", "/internal/v1/agents/resume", "/internal/v1/agents/replicas"]
    # 42 failed credentials from one address in a second: throttling would (rightly) step in.
    lenient = isolated_throttle(free_failures=999, lock_after=1000, account_free_failures=999,
                                account_lock_after=1000, address_free_failures=999, address_lock_after=1000)
    with serve(create_app(settings.model_copy(update={"signin_throttle": lenient}))) as url:
        for path in doors:
            for auth in (None, "Bearer nmb_abcdefgh_" + "x" * 43, "Bearer not-a-token"):
                answer = _raw(url, path, auth, wait_s=5.0)
                assert answer.startswith(b"HTTP/1.1 401"), (path, auth, answer[:80])
        assert _raw(url, "/admin/v1/tenants", f"Bearer {ADMIN_TOKEN}", wait_s=1.0) == b""
        assert _raw(url, "/internal/v1/edge/activate", f"Bearer {EDGE_TOKEN}", wait_s=1.0) == b""


def test_oversized_bodies_are_413(settings, admin) -> None:
    cases = [("/admin/v1/tenants", MAX_BODY_BYTES, admin), ("/admin/v1/catalog/import", CATALOG_MAX_BODY_BYTES, admin),
             ("/internal/v1/agents/register", AGENT_MAX_BODY_BYTES, {})]
    with serve(create_app(settings)) as url, httpx.Client(base_url=url, timeout=30) as c:
        for path, limit, headers in cases:
            body = b'{"pad": "' + b"x" * (limit - 10) + b'"}'
            assert len(body) > limit
            r = c.post(path, content=body, headers={**JSON, **headers})
            assert r.status_code == 413, (path, r.status_code)

            def chunks(body=body):  # no Content-Length: the limit holds on the streamed bytes
                for i in range(0, len(body), 64 * 1024):
                    yield body[i:i + 64 * 1024]

            r = c.post(path, content=chunks(), headers={**JSON, **headers})
            assert r.status_code == 413, (path, "chunked", r.status_code)
        # The catalog import takes more than the default limit.
        catalog = factories.catalog()
        catalog["generated_by"] = "x" * (2 * MAX_BODY_BYTES)
        r = c.post("/admin/v1/catalog/import", json=catalog, headers=admin)
        assert r.status_code != 413 and r.status_code < 500, r.status_code


async def test_type_errors_name_the_field(client, admin) -> None:
    async def problem(path: str, body) -> tuple[int, list[str]]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = await client.post(path, content=raw, headers={**JSON, **admin})
        return r.status_code, [e["field"] for e in r.json().get("errors", [])]

    assert await problem("/admin/v1/tenants", {"name": 5}) == (400, ["name"])
    assert await problem("/admin/v1/tenants", {"name": "x", "email": ["a"]}) == (400, ["email"])
    assert await problem("/admin/v1/tenants", {"name": "x", "limits": {}}) == (400, ["limits"])
    assert await problem("/admin/v1/tenants", [1, 2]) == (400, ["body"])
    assert await problem("/admin/v1/tenants", b'{"name": "a"') == (400, ["body"])
    assert await problem("/admin/v1/tenants", b"\xff\xfe") == (400, ["body"])
    pool = {"name": "p", "variant_id": str(uuid.uuid4()), "placement": [{"cloud": 5}]}
    assert await problem("/admin/v1/pools", pool) == (400, ["placement[0].cloud"])
    bad_catalog = factories.catalog()
    bad_catalog["clouds"][0]["regions"][0]["instance_types"][0]["gpu_count"] = "eight"
    assert await problem("/admin/v1/catalog/import", bad_catalog) == (
        422, ["clouds/0/regions/0/instance_types/0/gpu_count"])
