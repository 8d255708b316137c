"""The keys page changes an existing key's model allowlist (none checked: every model), under CSRF."""

from __future__ import annotations

from tests.console.conftest import csrf_of, sign_in_with_key, tenant_with_key
from tests.controlplane.factories import create_model, create_pool, import_catalog


async def test_an_existing_keys_models_are_changed_from_the_keys_page(web, api, admin):
    await import_catalog(api, admin)
    model = await create_model(api, admin)
    await create_pool(api, admin, model["variants"][0]["id"])
    tenant, key, secret = await tenant_with_key(api, admin)
    await sign_in_with_key(web, secret)
    page = await web.get("/console/keys")
    assert f'action="/console/keys/{key["id"]}/models"' in page.text
    token = csrf_of(page.text)
    tier = model["name"]  # the one choice: the tenant's pool serves one tier

    def allowlist():
        return api.get(f"/admin/v1/tenants/{tenant['id']}/keys", headers=admin)

    denied = await web.post(f"/console/keys/{key['id']}/models", data={f"model__{tier}": "1"})
    assert denied.status_code == 403
    changed = await web.post(f"/console/keys/{key['id']}/models", data={"_csrf": token, f"model__{tier}": "1"})
    assert changed.status_code == 200 and "now has the models" in changed.text
    assert f'name="model__{tier}" value="1" checked' in changed.text  # the form shows what the key has
    rows = {k["id"]: k for k in (await allowlist()).json()["items"]}
    assert rows[key["id"]]["allowed_models"] == [tier]
    lifted = await web.post(f"/console/keys/{key['id']}/models", data={"_csrf": token})
    assert lifted.status_code == 200
    rows = {k["id"]: k for k in (await allowlist()).json()["items"]}
    assert rows[key["id"]]["allowed_models"] is None
    unknown = await web.post(f"/console/keys/{key['id']}/models", data={"_csrf": token, "model__no-such-model": "1"})
    assert unknown.status_code >= 400 and "no-such-model" in unknown.text
