"""Admin API behaviour: CRUD, validation with field errors, audit trail, pagination."""

from __future__ import annotations

import uuid

from tests.controlplane import factories as f


async def test_admin_requires_token(client) -> None:
    r = await client.get("/admin/v1/tenants")
    assert r.status_code == 401
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["status"] == 401
    r = await client.get("/admin/v1/tenants", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


async def test_tenant_lifecycle_and_audit(client, admin) -> None:
    t = await f.create_tenant(client, admin, display_name="Acme", quota={"requests_per_minute": 60})
    assert t["status"] == "active" and t["quota"]["requests_per_minute"] == 60
    r = await client.post(f"/admin/v1/tenants/{t['id']}/suspend", headers=admin)
    assert r.status_code == 200 and r.json()["status"] == "suspended"
    r = await client.post(f"/admin/v1/tenants/{t['id']}/resume", headers=admin)
    assert r.json()["status"] == "active"
    r = await client.put(f"/admin/v1/tenants/{t['id']}/quota", json={"tokens_per_minute": 1000}, headers=admin)
    assert r.status_code == 200 and r.json() == {
        "requests_per_minute": None, "tokens_per_minute": 1000, "max_concurrent_requests": None,
        "max_gpus": None, "monthly_token_budget": None}
    r = await client.delete(f"/admin/v1/tenants/{t['id']}", headers=admin)
    assert r.status_code == 204
    assert (await client.get(f"/admin/v1/tenants/{t['id']}", headers=admin)).status_code == 404
    audit = (await client.get(f"/admin/v1/audit?tenant_id={t['id']}&limit=50", headers=admin)).json()
    actions = [a["action"] for a in audit["items"]]
    for expected in ("tenant.create", "tenant.suspend", "tenant.resume", "quota.update", "tenant.delete"):
        assert expected in actions
    assert all(a["actor"] == "admin" for a in audit["items"])


async def test_duplicate_names_conflict(client, admin) -> None:
    t = await f.create_tenant(client, admin)
    r = await client.post("/admin/v1/tenants", json={"name": t["name"]}, headers=admin)
    assert r.status_code == 409
    assert r.json()["errors"][0]["field"] == "name"


async def test_validation_errors_are_problem_details(client, admin) -> None:
    r = await client.post("/admin/v1/tenants", json={"name": "Not A Slug!"}, headers=admin)
    assert r.status_code == 400
    body = r.json()
    assert body["title"] and body["errors"] and any("name" in e["field"] for e in body["errors"])
    r = await client.post("/admin/v1/tenants", json={"name": "ok-name", "surprise": 1}, headers=admin)
    assert r.status_code == 400


async def test_pagination_and_filter(client, admin) -> None:
    made = [await f.create_tenant(client, admin) for _ in range(5)]
    page1 = (await client.get("/admin/v1/tenants?limit=2&offset=0", headers=admin)).json()
    page2 = (await client.get("/admin/v1/tenants?limit=2&offset=2", headers=admin)).json()
    assert page1["total"] == 5 and len(page1["items"]) == 2 and len(page2["items"]) == 2
    assert not {x["id"] for x in page1["items"]} & {x["id"] for x in page2["items"]}
    await client.post(f"/admin/v1/tenants/{made[0]['id']}/suspend", headers=admin)
    suspended = (await client.get("/admin/v1/tenants?status=suspended", headers=admin)).json()
    assert [x["id"] for x in suspended["items"]] == [made[0]["id"]]


async def test_keys_secret_shown_once(client, admin) -> None:
    t = await f.create_tenant(client, admin)
    key, secret = await f.create_key(client, admin, t["id"], name="ci")
    assert secret.startswith(key["prefix"] + "_")
    listed = (await client.get(f"/admin/v1/tenants/{t['id']}/keys", headers=admin)).text
    assert secret not in listed and key["prefix"] in listed
    r = await client.delete(f"/admin/v1/tenants/{t['id']}/keys/{key['id']}", headers=admin)
    assert r.status_code == 200 and r.json()["revoked_at"]
    listed = (await client.get(f"/admin/v1/tenants/{t['id']}/keys", headers=admin)).json()
    assert listed["total"] == 0
    listed = (await client.get(f"/admin/v1/tenants/{t['id']}/keys?include_revoked=true", headers=admin)).json()
    assert listed["total"] == 1


async def test_catalog_import_is_idempotent_and_authoritative(client, admin) -> None:
    first = await f.import_catalog(client, admin)
    assert first["regions"] == 3 and first["instance_types"] == 4
    await f.import_catalog(client, admin)
    regions = (await client.get("/admin/v1/catalog/regions", headers=admin)).json()
    assert [(r["cloud"], r["name"]) for r in regions] == [
        ("aws", "us-east-1"), ("aws", "us-west-2"), ("gcp", "us-central1")]
    east = regions[0]
    assert [z["name"] for z in east["zones"]] == ["us-east-1a", "us-east-1b"] and east["zones"][0]["subnet"] == "subnet-a"
    g6 = next(t for t in east["instance_types"] if t["name"] == "g6.xlarge")
    assert (g6["gpu_type"], g6["gpu_count"], g6["gpu_memory_gb"], g6["spot_price"]) == ("l4", 1, 24, 0.3)
    doc = f.catalog()
    doc["clouds"][0]["regions"] = doc["clouds"][0]["regions"][:1]
    r = await client.post("/admin/v1/catalog/import", json=doc, headers=admin)
    assert r.json()["removed_regions"] == ["aws/us-west-2"]
    bad = f.catalog()
    del bad["clouds"][0]["regions"][0]["template"]
    r = await client.post("/admin/v1/catalog/import", json=bad, headers=admin)
    assert r.status_code == 422
    assert any("clouds/0/regions/0" in e["field"] for e in r.json()["errors"])


async def test_models_and_variants(client, admin) -> None:
    m = await f.create_model(client, admin)
    assert {v["tier"] for v in m["variants"]} == {"bf16", "fp8"} and m["default_tier"] == "bf16"
    r = await client.post(f"/admin/v1/models/{m['id']}/variants",
                          json={"tier": "fp8", "model_path": "x", "gpu_memory_gb": 10, "context_length": 10},
                          headers=admin)
    assert r.status_code == 409
    r = await client.post(f"/admin/v1/models/{m['id']}/variants",
                          json={"tier": "int4", "model_path": "x-awq", "gpu_memory_gb": 8, "context_length": 8192,
                                "quantization": "awq"}, headers=admin)
    assert r.status_code == 201 and r.json()["quantization"] == "awq"
    variant_id = r.json()["id"]
    assert r.json()["output_token_weight"] is None
    r = await client.patch(f"/admin/v1/variants/{variant_id}", json={"context_length": 4096}, headers=admin)
    assert r.json()["context_length"] == 4096
    # The profile: weighted tokens/s per GPU type and what a generated token weighs.
    r = await client.patch(f"/admin/v1/variants/{variant_id}",
                           json={"profiled_tokens_per_s": {"H100": 8500}, "output_token_weight": 3.8}, headers=admin)
    assert r.status_code == 200
    assert r.json()["profiled_tokens_per_s"] == {"h100": 8500.0} and r.json()["output_token_weight"] == 3.8
    r = await client.patch(f"/admin/v1/variants/{variant_id}", json={"output_token_weight": 0}, headers=admin)
    assert r.status_code in (400, 422) and "output_token_weight" in r.text


async def test_pool_validation(client, admin) -> None:
    await f.import_catalog(client, admin)
    m = await f.create_model(client, admin)
    vid = m["variants"][0]["id"]
    bad = {"name": "p1", "variant_id": vid, "placement": [{"cloud": "aws", "region": "us-east-1"}],
           "min_replicas": 3, "max_replicas": 1}
    r = await client.post("/admin/v1/pools", json=bad, headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "min_replicas"
    r = await client.post("/admin/v1/pools", json={**bad, "min_replicas": 1, "variant_id": str(uuid.uuid4())},
                          headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "variant_id"
    r = await client.post("/admin/v1/pools", json={**bad, "min_replicas": 1,
                                                   "placement": [{"cloud": "aws", "region": "mars-1"}]}, headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "placement[0].region"
    r = await client.post("/admin/v1/pools", json={**bad, "min_replicas": 1,
                                                   "placement": [{"cloud": "aws", "region": "us-east-1",
                                                                  "zones": ["us-east-1z"]}]}, headers=admin)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "placement[0].zones"
    pool = await f.create_pool(client, admin, vid)
    assert pool["desired_replicas"] == 1 and pool["model"] == m["name"]
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"max_replicas": 0}, headers=admin)
    assert r.status_code == 422
    r = await client.delete(f"/admin/v1/models/{m['id']}", headers=admin)
    assert r.status_code == 409


async def test_dedicated_pool_respects_gpu_quota(client, admin) -> None:
    await f.import_catalog(client, admin)
    m = await f.create_model(client, admin)
    t = await f.create_tenant(client, admin, quota={"max_gpus": 1})
    body = {"name": f.unique("ded"), "variant_id": m["variants"][0]["id"], "dedicated_tenant_id": t["id"],
            "placement": [{"cloud": "aws", "region": "us-east-1"}], "min_replicas": 2, "max_replicas": 4}
    r = await client.post("/admin/v1/pools", json=body, headers=admin)
    assert r.status_code == 422 and "GPU quota" in r.json()["detail"]
    r = await client.post("/admin/v1/pools", json={**body, "min_replicas": 1}, headers=admin)
    assert r.status_code == 201


async def test_openapi_served(client) -> None:
    r = await client.get("/schema/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    assert "/admin/v1/tenants" in paths and "/v1/tenant/keys" in paths
