"""The internal snapshot edges pull: auth, ETag/304, and what it carries (hashes, never secrets)."""

from __future__ import annotations

import hashlib

from tests.controlplane import factories as f
from tests.controlplane.conftest import EDGE_TOKEN

EDGE = {"Authorization": f"Bearer {EDGE_TOKEN}"}


async def test_snapshot_requires_edge_token(client, admin) -> None:
    assert (await client.get("/internal/v1/edge/snapshot")).status_code == 401
    assert (await client.get("/internal/v1/edge/snapshot", headers=admin)).status_code == 401


async def test_snapshot_content_and_etag(client, admin) -> None:
    await f.import_catalog(client, admin)
    t = await f.create_tenant(client, admin, quota={"requests_per_minute": 10})
    live_key, live_secret = await f.create_key(client, admin, t["id"])
    dead_key, _ = await f.create_key(client, admin, t["id"])
    await client.delete(f"/admin/v1/tenants/{t['id']}/keys/{dead_key['id']}", headers=admin)
    m = await f.create_model(client, admin)
    pool = await f.create_pool(client, admin, m["variants"][1]["id"], kind="scale_to_zero", min_replicas=0)

    r = await client.get("/internal/v1/edge/snapshot", headers=EDGE)
    assert r.status_code == 200
    snap = r.json()
    etag = r.headers["etag"]
    assert live_secret not in r.text
    keys = {k["prefix"]: k for k in snap["keys"]}
    assert dead_key["prefix"] not in keys
    assert keys[live_key["prefix"]]["sha256"] == hashlib.sha256(live_secret.encode()).hexdigest()
    tenant = next(x for x in snap["tenants"] if x["id"] == t["id"])
    assert tenant["limits"]["requests_per_minute"] == 10 and tenant["limits"]["monthly_tokens_used"] == 0
    (model,) = [x for x in snap["models"] if x["name"] == m["name"]]
    assert [v["tier"] for v in model["variants"]] == ["fp8"]  # only variants a pool serves
    assert model["variants"][0]["served_model_name"] == f"{m['name']}-fp8"
    assert {"id": pool["id"], "variant_id": pool["variant_id"], "kind": "scale_to_zero",
            "dedicated_tenant_id": None, "ttft_slo_ms": pool["ttft_slo_ms"]} in snap["pools"]

    r = await client.get("/internal/v1/edge/snapshot", headers={**EDGE, "If-None-Match": etag})
    assert r.status_code == 304

    await client.post(f"/admin/v1/tenants/{t['id']}/suspend", headers=admin)
    client.app.state.edge_snapshot = None  # skip the 1 s build cache
    r = await client.get("/internal/v1/edge/snapshot", headers={**EDGE, "If-None-Match": etag})
    assert r.status_code == 200 and r.headers["etag"] != etag


async def test_activation(client, admin) -> None:
    await f.import_catalog(client, admin)
    m = await f.create_model(client, admin)
    pool = await f.create_pool(client, admin, m["variants"][0]["id"], kind="scale_to_zero", min_replicas=0)
    r = await client.post("/internal/v1/edge/activate", headers=EDGE,
                          json={"pool_id": pool["id"], "variant_id": pool["variant_id"]})
    assert r.status_code == 202
    r = await client.post("/internal/v1/edge/activate", headers=EDGE,
                          json={"pool_id": pool["id"], "variant_id": m["variants"][1]["id"]})
    assert r.status_code == 404


async def test_a_variants_priority_scheduling_and_embedding_task_reach_the_edges(client, admin) -> None:
    from controlplane.services.edge_snapshot import priority_scheduling

    assert priority_scheduling({}) is None
    assert priority_scheduling({"enable_priority_scheduling": True}) == "high_first"
    assert priority_scheduling({"enable-priority-scheduling": True, "schedule_low_priority_values_first": True}) \
        == "low_first"
    await f.import_catalog(client, admin)
    r = await client.post("/admin/v1/models", headers=admin, json={"name": f.unique("prio"), "variants": [
        {"tier": "bf16", "model_path": "meta-llama/Llama-3.1-8B-Instruct", "gpu_memory_gb": 20, "context_length": 8192,
         "engine_args": {"enable_priority_scheduling": True}},
        {"tier": "fp8", "model_path": "BAAI/bge-large-en-v1.5", "gpu_memory_gb": 4, "context_length": 512,
         "quantization": "fp8", "engine_args": {"is_embedding": True}}]})
    assert r.status_code == 201, r.text
    m = r.json()
    for v in m["variants"]:
        await f.create_pool(client, admin, v["id"])
    snap = (await client.get("/internal/v1/edge/snapshot", headers=EDGE)).json()
    (model,) = [x for x in snap["models"] if x["name"] == m["name"]]
    variants = {v["tier"]: v for v in model["variants"]}
    assert variants["bf16"]["priority_scheduling"] == "high_first" and variants["bf16"]["task"] == "generate"
    assert variants["fp8"]["priority_scheduling"] is None and variants["fp8"]["task"] == "embed"
