"""Tenant self-service API: isolation between tenants, suspension, revocation, expiry, usage."""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest

from controlplane.db.engine import session_scope
from controlplane.services import usage
from tests.controlplane import factories as f


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
async def two_tenants(client, admin):
    a = await f.create_tenant(client, admin)
    b = await f.create_tenant(client, admin)
    a_key, a_secret = await f.create_key(client, admin, a["id"])
    b_key, b_secret = await f.create_key(client, admin, b["id"])
    return {"a": a, "b": b, "a_key": a_key, "b_key": b_key, "a_secret": a_secret, "b_secret": b_secret}


async def test_me_is_own_tenant(client, two_tenants) -> None:
    r = await client.get("/v1/tenant/me", headers=bearer(two_tenants["a_secret"]))
    assert r.status_code == 200 and r.json()["id"] == two_tenants["a"]["id"]


async def test_tenant_b_cannot_touch_tenant_a_resources(client, two_tenants) -> None:
    b = bearer(two_tenants["b_secret"])
    a_key_id = two_tenants["a_key"]["id"]
    # Revoking A's key with B's credentials: 404, the same answer as for a key that does not exist.
    r = await client.delete(f"/v1/tenant/keys/{a_key_id}", headers=b)
    assert r.status_code == 404
    r = await client.delete(f"/v1/tenant/keys/{uuid.uuid4()}", headers=b)
    assert r.status_code == 404
    listed = (await client.get("/v1/tenant/keys", headers=b)).json()
    assert [k["id"] for k in listed["items"]] == [two_tenants["b_key"]["id"]]
    # A's key still works: B's attempt changed nothing.
    r = await client.get("/v1/tenant/me", headers=bearer(two_tenants["a_secret"]))
    assert r.status_code == 200


async def test_usage_is_scoped(client, settings, two_tenants, admin) -> None:
    m = await f.create_model(client, admin)
    vid = m["variants"][0]["id"]
    now = dt.datetime.now(dt.UTC)
    events = [
        {"request_id": f"r{i}", "tenant_id": two_tenants["a"]["id"], "variant_id": vid, "ts": str(now.timestamp()),
         "prompt_tokens": "100", "completion_tokens": "20", "cached_tokens": "50", "status": "ok",
         "ttft_ms": "40", "queue_ms": "2", "duration_ms": "300"}
        for i in range(3)
    ]
    # An answer from the edge's response cache: a request, no GPU tokens, counted as a cached response.
    events.append({"request_id": "hit", "tenant_id": two_tenants["a"]["id"], "variant_id": vid,
                   "ts": str(now.timestamp()), "prompt_tokens": "0", "completion_tokens": "0", "status": "ok",
                   "cache": "hit"})
    with session_scope(settings) as s:
        assert usage.ingest(s, events) == 4
    with session_scope(settings) as s:  # redelivery counts nothing twice
        assert usage.ingest(s, events) == 0
    start = (now - dt.timedelta(hours=1)).isoformat()
    a = (await client.get("/v1/tenant/usage", params={"start": start, "granularity": "total"},
                          headers=bearer(two_tenants["a_secret"]))).json()
    assert a["total"]["requests"] == 4 and a["total"]["prompt_tokens"] == 300
    assert a["total"]["cached_responses"] == 1
    assert a["total"]["cache_hit_rate"] == pytest.approx(0.5)
    assert a["series"][0]["model"] == m["name"] and a["series"][0]["tier"] == "bf16"
    b = (await client.get("/v1/tenant/usage", params={"start": start},
                          headers=bearer(two_tenants["b_secret"]))).json()
    assert b["total"]["requests"] == 0 and b["series"] == []
    r = await client.get("/v1/tenant/usage", params={"start": now.isoformat(), "end": start},
                         headers=bearer(two_tenants["a_secret"]))
    assert r.status_code == 422


async def test_models_visible_to_tenant(client, admin, two_tenants) -> None:
    await f.import_catalog(client, admin)
    shared = await f.create_model(client, admin)
    private = await f.create_model(client, admin, tiers=("bf16",))
    await f.create_pool(client, admin, shared["variants"][1]["id"])
    await f.create_pool(client, admin, private["variants"][0]["id"], dedicated_tenant_id=two_tenants["a"]["id"])
    a = {m["name"] for m in (await client.get("/v1/tenant/models", headers=bearer(two_tenants["a_secret"]))).json()}
    b = {m["name"] for m in (await client.get("/v1/tenant/models", headers=bearer(two_tenants["b_secret"]))).json()}
    assert a == {shared["name"], private["name"]}
    assert b == {shared["name"]}


async def test_suspended_tenant_gets_403(client, admin, two_tenants) -> None:
    await client.post(f"/admin/v1/tenants/{two_tenants['a']['id']}/suspend", headers=admin)
    r = await client.get("/v1/tenant/me", headers=bearer(two_tenants["a_secret"]))
    assert r.status_code == 403
    r = await client.get("/v1/tenant/keys", headers=bearer(two_tenants["a_secret"]))
    assert r.status_code == 403


async def test_revoked_key_gets_401(client, two_tenants) -> None:
    a = bearer(two_tenants["a_secret"])
    created = (await client.post("/v1/tenant/keys", json={"name": "temp", "scopes": ["inference", "manage"]},
                                 headers=a)).json()
    new = bearer(created["secret"])
    assert (await client.get("/v1/tenant/me", headers=new)).status_code == 200
    r = await client.delete(f"/v1/tenant/keys/{created['key']['id']}", headers=a)
    assert r.status_code == 200
    assert (await client.get("/v1/tenant/me", headers=new)).status_code == 401


async def test_expired_key_gets_401(client, admin, settings, two_tenants) -> None:
    key, secret = await f.create_key(
        client, admin, two_tenants["a"]["id"],
        expires_at=(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat())
    assert (await client.get("/v1/tenant/me", headers=bearer(secret))).status_code == 200
    with psycopg.connect(settings.resolved_database_url.replace("+psycopg", "")) as conn:
        conn.execute("UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = %s", (key["id"],))
    client.app.state.key_verifier.forget_all()
    assert (await client.get("/v1/tenant/me", headers=bearer(secret))).status_code == 401


async def test_missing_or_garbage_key_gets_401(client) -> None:
    assert (await client.get("/v1/tenant/me")).status_code == 401
    assert (await client.get("/v1/tenant/me", headers=bearer("nmb_zzzzzzzz_" + "x" * 43))).status_code == 401
    assert (await client.get("/v1/tenant/me", headers={"Authorization": "Basic abc"})).status_code == 401


async def test_inference_only_key_cannot_manage(client, admin, two_tenants) -> None:
    _, secret = await f.create_key(client, admin, two_tenants["a"]["id"], scopes=("inference",))
    assert (await client.get("/v1/tenant/keys", headers=bearer(secret))).status_code == 403
    # and a manage key cannot mint more than it holds
    _, manage_only = await f.create_key(client, admin, two_tenants["a"]["id"], scopes=("manage",))
    r = await client.post("/v1/tenant/keys", json={"scopes": ["inference"]}, headers=bearer(manage_only))
    assert r.status_code == 403


async def test_database_holds_no_plaintext_key(client, admin, settings, two_tenants) -> None:
    secrets = [two_tenants["a_secret"], two_tenants["b_secret"]]
    with psycopg.connect(settings.resolved_database_url.replace("+psycopg", "")) as conn:
        dump = "\n".join(
            str(row)
            for table in ("api_keys", "audit_events", "tenants")
            for row in conn.execute(f"SELECT * FROM {table}").fetchall()
        )
    assert two_tenants["a_key"]["prefix"] in dump  # the rows are really there
    for s in secrets:
        assert s not in dump
        assert s.split("_", 2)[2] not in dump  # not even the secret part
