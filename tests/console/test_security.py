"""Security of the console over HTTP: cookies, CSRF, secrets shown once, sign-in rules, isolation."""

from __future__ import annotations

import re
import uuid

from pydantic import SecretStr
from sqlalchemy import create_engine, text

from controlplane.console.sessions import PLAYGROUND_KEY_NAME
from tests.console.conftest import (
    PASSWORD,
    csrf_of,
    sign_in_operator,
    sign_in_with_key,
    sign_in_with_password,
    tenant_with_key,
)
from tests.controlplane.conftest import ADMIN_TOKEN
from tests.controlplane.factories import create_key, create_model, create_pool, import_catalog

FULL_SECRET = re.compile(r"nmb_[a-z0-9]{8}_[A-Za-z0-9_-]{20,}")


def _set_cookie(response, name: str) -> str:
    for header in response.headers.get_list("set-cookie"):
        if header.startswith(name + "="):
            return header
    raise AssertionError(f"no Set-Cookie for {name}: {response.headers.get_list('set-cookie')}")


async def test_session_cookie_is_httponly_secure_samesite_strict(web, api, admin):
    _, _, secret = await tenant_with_key(api, admin)
    r = await sign_in_with_key(web, secret)
    assert r.status_code == 303 and r.headers["location"] == "/console/dashboard"
    cookie = _set_cookie(r, "nimbus_console").lower()
    for flag in ("httponly", "secure", "samesite=strict", "path=/console"):
        assert flag in cookie, cookie
    assert secret.lower() not in cookie  # the cookie is a random token, not the key
    page = await web.get("/console/dashboard")
    assert page.status_code == 200 and "Dashboard" in page.text
    assert page.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


async def test_csrf_token_is_required_for_every_change(web, api, admin):
    tenant, _, secret = await tenant_with_key(api, admin)
    await sign_in_with_key(web, secret)
    keys_page = await web.get("/console/keys")
    token = csrf_of(keys_page.text)
    before = (await api.get(f"/admin/v1/tenants/{tenant['id']}/keys", headers=admin)).json()["total"]

    missing = await web.post("/console/keys", data={"name": "x", "scope_inference": "1"})
    wrong = await web.post("/console/keys", data={"name": "x", "scope_inference": "1", "_csrf": token + "x"})
    assert missing.status_code == 403 and wrong.status_code == 403
    assert "CSRF" in missing.text
    assert (await api.get(f"/admin/v1/tenants/{tenant['id']}/keys", headers=admin)).json()["total"] == before

    # the same token in a header works too (the playground sends it that way)
    ok = await web.post("/console/keys", data={"name": "x", "scope_inference": "1"}, headers={"X-CSRF-Token": token})
    assert ok.status_code == 201
    # sign-out is a change too: without the token the session survives
    assert (await web.post("/console/logout", data={})).status_code == 403
    assert (await web.get("/console/keys", follow_redirects=False)).status_code == 200
    # and sign-in forms carry their own double-submit token (login CSRF)
    assert (await web.post("/console/login", data={"method": "key", "api_key": secret})).status_code == 403


async def test_new_secret_is_shown_once_and_never_again(web, api, admin):
    _, _, secret = await tenant_with_key(api, admin)
    await sign_in_with_key(web, secret)
    token = csrf_of((await web.get("/console/keys")).text)
    created = await web.post("/console/keys", data={"_csrf": token, "name": "ci", "scope_inference": "1"})
    assert created.status_code == 201
    shown = FULL_SECRET.findall(created.text)
    assert len(shown) == 1, "exactly one secret on the creation page"
    assert created.headers["cache-control"] == "no-store"
    new_secret = shown[0]
    prefix = new_secret[:12]  # "nmb_" + 8 id chars
    # the key works (it is real), and afterwards the console only ever shows its prefix
    assert prefix in created.text
    for path in ("/console/keys", "/console/dashboard", "/console/playground", "/console/usage", "/console/models"):
        html = (await web.get(path)).text
        assert new_secret not in html and not FULL_SECRET.search(html), path
    assert prefix in (await web.get("/console/keys")).text


async def test_playground_key_is_minted_never_shown_and_revoked_at_logout(web, api, admin):
    tenant, _, secret = await tenant_with_key(api, admin)
    await sign_in_with_key(web, secret)
    listed = (await api.get(f"/admin/v1/tenants/{tenant['id']}/keys", headers=admin)).json()["items"]
    session_keys = [k for k in listed if k["name"] == PLAYGROUND_KEY_NAME]
    assert len(session_keys) == 1
    assert session_keys[0]["scopes"] == ["inference"] and session_keys[0]["expires_at"] is not None
    html = (await web.get("/console/playground")).text
    assert not FULL_SECRET.search(html)

    token = csrf_of(html)
    out = await web.post("/console/logout", data={"_csrf": token}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    assert "max-age=0" in _set_cookie(out, "nimbus_console").lower()
    after = (await api.get(f"/admin/v1/tenants/{tenant['id']}/keys?include_revoked=true", headers=admin)).json()
    revoked = next(k for k in after["items"] if k["id"] == session_keys[0]["id"])
    assert revoked["revoked_at"] is not None
    # the old cookie value is dead even if a browser kept it
    assert (await web.get("/console/keys", follow_redirects=False)).status_code == 303


async def test_sign_in_rules(web, api, admin):
    tenant, _, _ = await tenant_with_key(api, admin, email="ops@example.com", password=PASSWORD)
    _, inference_only = await create_key(api, admin, tenant["id"], scopes=("inference",))
    assert (await sign_in_with_key(web, inference_only)).status_code == 401  # needs 'manage'
    assert (await sign_in_with_key(web, "nmb_abcdefgh_not-a-real-secret-at-all")).status_code == 401
    assert (await sign_in_with_password(web, "ops@example.com", "wrong password!")).status_code == 401
    assert (await sign_in_with_password(web, "nobody@example.com")).status_code == 401
    ok = await sign_in_with_password(web, "OPS@example.com")
    assert ok.status_code == 303
    assert (await web.get("/console/keys")).status_code == 200
    # suspending the tenant ends its console sessions at once
    assert (await api.post(f"/admin/v1/tenants/{tenant['id']}/suspend", headers=admin)).status_code == 200
    assert (await web.get("/console/keys", follow_redirects=False)).headers["location"] == "/console/login"


async def test_revoking_the_sign_in_key_ends_the_session(web, api, admin):
    tenant, key, secret = await tenant_with_key(api, admin)
    await sign_in_with_key(web, secret)
    assert (await web.get("/console/keys", follow_redirects=False)).status_code == 200
    r = await api.delete(f"/admin/v1/tenants/{tenant['id']}/keys/{key['id']}", headers=admin)
    assert r.status_code in (200, 204), r.text
    assert (await web.get("/console/keys", follow_redirects=False)).status_code == 303


async def test_tenant_cannot_reach_another_tenants_things(web, api, admin):
    await import_catalog(api, admin)
    _, _, a_secret = await tenant_with_key(api, admin)
    b, b_key, _ = await tenant_with_key(api, admin)
    private = await create_model(api, admin, tiers=("bf16",))
    await create_pool(api, admin, private["variants"][0]["id"], dedicated_tenant_id=b["id"])
    await sign_in_with_key(web, a_secret)
    token = csrf_of((await web.get("/console/keys")).text)

    assert b_key["prefix"] not in (await web.get("/console/keys")).text
    # B's key id is "not found" for A, and stays active
    r = await web.post(f"/console/keys/{b_key['id']}/revoke", data={"_csrf": token})
    assert r.status_code == 404
    b_keys = (await api.get(f"/admin/v1/tenants/{b['id']}/keys", headers=admin)).json()["items"]
    assert all(k["revoked_at"] is None for k in b_keys)
    # B's dedicated model: absent from A's list, its page 404, the playground refuses it
    assert private["name"] not in (await web.get("/console/models")).text
    assert (await web.get(f"/console/models/{private['name']}")).status_code == 404
    r = await web.post("/console/playground/stream", data={"model": private["name"], "message": "hi"},
                       headers={"X-CSRF-Token": token})
    assert r.status_code == 404
    # a random id is answered exactly the same way
    assert (await web.post(f"/console/keys/{uuid.uuid4()}/revoke", data={"_csrf": token})).status_code == 404


async def test_operator_views_need_their_own_session(web, api, admin):
    _, _, secret = await tenant_with_key(api, admin)
    await sign_in_with_key(web, secret)
    # a tenant session does not open operator pages
    for path in ("/console/admin/pools", "/console/admin/fleet", f"/console/admin/nodes/{uuid.uuid4()}"):
        r = await web.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/console/admin/login", path
    assert (await sign_in_operator(web, "wrong-token")).status_code == 401
    ok = await sign_in_operator(web)
    assert ok.status_code == 303
    cookie = _set_cookie(ok, "nimbus_operator").lower()
    assert "httponly" in cookie and "secure" in cookie and "samesite=strict" in cookie
    assert ADMIN_TOKEN not in cookie
    for path in ("/console/admin", "/console/admin/pools", "/console/admin/fleet", "/console/admin/nodes",
                 "/console/admin/operations"):
        page = await web.get(path)
        assert page.status_code == 200, path
        assert ADMIN_TOKEN not in page.text
    assert (await web.get(f"/console/admin/nodes/{uuid.uuid4()}")).status_code == 404


async def test_rotating_the_admin_token_ends_operator_sessions(web, settings, admin):
    await sign_in_operator(web)
    assert (await web.get("/console/admin/nodes", follow_redirects=False)).status_code == 200
    settings.admin_token = SecretStr("a-brand-new-admin-token-42")  # the app holds this same object
    r = await web.get("/console/admin/nodes", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/admin/login"


async def test_expired_sessions_stop_working_and_are_swept(web, api, admin, settings):
    _, _, secret = await tenant_with_key(api, admin)
    await sign_in_with_key(web, secret)
    engine = create_engine(settings.database_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE console_sessions SET expires_at = now() - interval '1 minute'"))
    assert (await web.get("/console/keys", follow_redirects=False)).status_code == 303
    await sign_in_with_key(web, secret)  # any sign-in sweeps expired rows
    with engine.connect() as conn:
        left = conn.execute(text("SELECT count(*) FROM console_sessions WHERE expires_at <= now()")).scalar()
    engine.dispose()
    assert left == 0
