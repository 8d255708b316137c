"""A tenant's response caches through the tenant API: the semantic cache per model with a threshold
inside the operator's bounds, carried to the edges by the snapshot, and "clear my cache", which
deletes the tenant's entries (and only its own) from the edges' shared store on the real Redis."""

from __future__ import annotations

import asyncio
import uuid

import redis

from tests.controlplane import factories as f
from tests.controlplane.conftest import EDGE_TOKEN


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def snapshot_tenant(client, tenant_id: str, expect=None) -> dict:
    """The tenant as the edges' snapshot has it; the API caches the snapshot for a second, so
    with ``expect`` wait (up to 3 s) until it shows the change."""
    for _ in range(30):
        snap = (await client.get("/internal/v1/edge/snapshot", headers=bearer(EDGE_TOKEN))).json()
        tenant = {t["id"]: t for t in snap["tenants"]}[tenant_id]
        if expect is None or expect(tenant):
            return tenant
        await asyncio.sleep(0.1)
    return tenant


async def test_semantic_cache_settings_within_the_operators_bounds(client, admin, settings) -> None:
    m = await f.create_model(client, admin)
    t = await f.create_tenant(client, admin)
    _, manager = await f.create_key(client, admin, t["id"])
    me = bearer(manager)

    got = (await client.get("/v1/tenant/cache", headers=me)).json()
    assert got == {"response_cache": False, "semantic_cache_models": [],
                   "semantic_cache_threshold": settings.semantic_cache_threshold_default,
                   "threshold_bounds": [settings.semantic_cache_threshold_min, settings.semantic_cache_threshold_max]}
    assert (await snapshot_tenant(client, t["id"]))["semantic_cache"] is None

    for bad in (settings.semantic_cache_threshold_min - 0.01, 1.5):
        r = await client.patch("/v1/tenant/cache", headers=me, json={"semantic_cache_threshold": bad})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "semantic_cache_threshold"
    r = await client.patch("/v1/tenant/cache", headers=me, json={"semantic_cache_models": ["bad name!"]})
    assert r.status_code in (400, 422)
    r = await client.patch("/v1/tenant/cache", headers=me, json={"no_such_field": True})
    assert r.status_code == 400

    r = await client.patch("/v1/tenant/cache", headers=me,
                           json={"semantic_cache_models": [m["name"], m["name"]], "semantic_cache_threshold": 0.9})
    assert r.status_code == 200, r.text
    assert r.json()["semantic_cache_models"] == [m["name"]] and r.json()["semantic_cache_threshold"] == 0.9
    want = {"models": [m["name"]], "threshold": 0.9}
    assert (await snapshot_tenant(client, t["id"], lambda t: t["semantic_cache"] == want))["semantic_cache"] == want
    r = await client.patch("/v1/tenant/cache", headers=me, json={"response_cache": True})
    assert r.json()["response_cache"] and r.json()["semantic_cache_models"] == [m["name"]]  # the rest unchanged
    r = await client.patch("/v1/tenant/cache", headers=me, json={"semantic_cache_models": []})
    assert r.json()["semantic_cache_models"] == []
    tenant = await snapshot_tenant(client, t["id"], lambda t: t["semantic_cache"] is None)
    assert tenant["semantic_cache"] is None and tenant["response_cache"] is True
    admin_view = (await client.get(f"/admin/v1/tenants/{t['id']}", headers=admin)).json()
    assert admin_view["semantic_cache_threshold"] == 0.9 and admin_view["response_cache"] is True


async def test_clear_my_cache_deletes_only_my_entries(client, admin, settings) -> None:
    mine, theirs = await f.create_tenant(client, admin), await f.create_tenant(client, admin)
    _, manager = await f.create_key(client, admin, mine["id"])
    r = redis.Redis.from_url(settings.redis_url)
    region = f"test-{uuid.uuid4().hex[:8]}"
    root = f"{settings.edge_redis_key_prefix}rcache:{region}:"
    log = f"{settings.edge_redis_key_prefix}scache:{region}:log"
    keys = [f"{root}{mine['id']}:exact", f"{root}{mine['id']}:s:semantic", f"{root}{theirs['id']}:exact"]
    try:
        for k in keys:
            r.set(k, b"{}", px=60_000)
        r.xadd(log, {"op": "add", "tenant": mine["id"]})
        resp = await client.delete("/v1/tenant/cache", headers=bearer(manager))
        assert resp.status_code == 200 and resp.json() == {"purged": 2}
        assert [bool(r.exists(k)) for k in keys] == [False, False, True]
        (_, last), = r.xrevrange(log, count=1)
        assert last == {b"op": b"purge", b"tenant": mine["id"].encode()}  # every edge drops my vectors
        unauthenticated = await client.delete("/v1/tenant/cache")
        assert unauthenticated.status_code == 401
    finally:
        r.delete(*keys, log)
