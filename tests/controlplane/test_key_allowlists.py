"""Per-key model allowlists in the admin and tenant APIs, and in the snapshot the edges enforce
(the edge side: tests/edge/test_key_allowlists.py)."""

from __future__ import annotations

import uuid

from tests.controlplane import factories as f
from tests.controlplane.conftest import EDGE_TOKEN


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_a_key_is_created_limited_to_models_and_tiers_that_exist(client, admin) -> None:
    m = await f.create_model(client, admin)
    t = await f.create_tenant(client, admin)
    key, _ = await f.create_key(client, admin, t["id"], allowed_models=[f"{m['name']}:fp8", m["name"], m["name"]])
    assert key["allowed_models"] == sorted({m["name"], f"{m['name']}:fp8"})  # deduplicated, sorted
    everything, _ = await f.create_key(client, admin, t["id"])
    assert everything["allowed_models"] is None

    r = await client.post(f"/admin/v1/tenants/{t['id']}/keys", headers=admin,
                          json={"allowed_models": ["no-such-model", f"{m['name']}:int4", m["name"]]})
    assert r.status_code == 422, r.text
    problems = {p["field"]: p["message"] for p in r.json()["errors"]}
    assert problems == {"allowed_models[0]": "no model named 'no-such-model'",
                        "allowed_models[1]": f"model '{m['name']}' has no tier 'int4'"}
    for bad in ([], ["has space"], ["x" * 200]):  # empty lists and malformed names are refused as shapes
        r = await client.post(f"/admin/v1/tenants/{t['id']}/keys", headers=admin, json={"allowed_models": bad})
        assert r.status_code in (400, 422), (bad, r.text)


async def test_admin_and_tenant_change_an_allowlist_and_the_snapshot_carries_it(client, admin) -> None:
    m = await f.create_model(client, admin)
    other = await f.create_model(client, admin)
    t = await f.create_tenant(client, admin)
    _, manager = await f.create_key(client, admin, t["id"])
    key, _ = await f.create_key(client, admin, t["id"], scopes=("inference",))

    r = await client.patch(f"/admin/v1/tenants/{t['id']}/keys/{key['id']}", headers=admin,
                           json={"allowed_models": [other["name"]]})
    assert r.status_code == 200 and r.json()["allowed_models"] == [other["name"]], r.text
    r = await client.patch(f"/v1/tenant/keys/{key['id']}", headers=bearer(manager),
                           json={"allowed_models": [m["name"]], "name": "ci"})
    assert r.status_code == 200 and r.json()["allowed_models"] == [m["name"]] and r.json()["name"] == "ci"
    snap = (await client.get("/internal/v1/edge/snapshot", headers=bearer(EDGE_TOKEN))).json()
    assert {k["prefix"]: k["allowed_models"] for k in snap["keys"]}[key["prefix"]] == [m["name"]]

    r = await client.patch(f"/v1/tenant/keys/{key['id']}", headers=bearer(manager), json={"name": "renamed"})
    assert r.json()["allowed_models"] == [m["name"]]  # a field not sent does not change
    r = await client.patch(f"/v1/tenant/keys/{key['id']}", headers=bearer(manager), json={"allowed_models": None})
    assert r.status_code == 200 and r.json()["allowed_models"] is None  # null lifts the allowlist

    # Another tenant's key is not found; a revoked key cannot be changed; unknown fields are refused.
    u = await f.create_tenant(client, admin)
    _, outsider = await f.create_key(client, admin, u["id"])
    r = await client.patch(f"/v1/tenant/keys/{key['id']}", headers=bearer(outsider), json={"allowed_models": None})
    assert r.status_code == 404
    assert (await client.patch(f"/v1/tenant/keys/{uuid.uuid4()}", headers=bearer(manager), json={})).status_code == 404
    r = await client.patch(f"/v1/tenant/keys/{key['id']}", headers=bearer(manager), json={"scopes": ["manage"]})
    assert r.status_code == 400
    await client.delete(f"/v1/tenant/keys/{key['id']}", headers=bearer(manager))
    r = await client.patch(f"/v1/tenant/keys/{key['id']}", headers=bearer(manager), json={"name": "x"})
    assert r.status_code == 422
