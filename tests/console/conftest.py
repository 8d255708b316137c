"""Console fixtures: the real app on the session's Postgres, an HTTPS-addressed test client (so
Secure cookies travel back, as in a browser), and sign-in helpers that go through the forms."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
from litestar.testing import AsyncTestClient

from controlplane.api.app import create_app
from controlplane.config import Settings
from tests.controlplane import conftest as controlplane_fixtures
from tests.controlplane.conftest import ADMIN_TOKEN
from tests.controlplane.factories import create_key, create_tenant

# The control-plane tests' own fixtures, reused as they are (fresh database per test, admin headers).
settings = controlplane_fixtures.settings
admin = controlplane_fixtures.admin

PASSWORD = "correct horse battery staple"
_CSRF_FIELD = re.compile(r'name="_csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    match = _CSRF_FIELD.search(html)
    assert match, "page has no CSRF field"
    return match.group(1)


@pytest.fixture
async def web(settings: Settings) -> AsyncIterator[AsyncTestClient]:
    async with AsyncTestClient(app=create_app(settings), base_url="https://testserver.local") as c:
        yield c


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[AsyncTestClient]:
    """A second client for admin API calls, with its own cookie jar."""
    async with AsyncTestClient(app=create_app(settings), base_url="https://testserver.local") as c:
        yield c


async def sign_in_with_key(client: AsyncTestClient, secret: str):
    form = await client.get("/console/login")
    return await client.post("/console/login", data={"_csrf": csrf_of(form.text), "method": "key", "api_key": secret},
                             follow_redirects=False)


async def sign_in_with_password(client: AsyncTestClient, email: str, password: str = PASSWORD):
    form = await client.get("/console/login")
    return await client.post(
        "/console/login", data={"_csrf": csrf_of(form.text), "method": "password", "email": email,
                                "password": password}, follow_redirects=False)


async def sign_in_operator(client: AsyncTestClient, token: str = ADMIN_TOKEN):
    form = await client.get("/console/admin/login")
    return await client.post("/console/admin/login", data={"_csrf": csrf_of(form.text), "token": token},
                             follow_redirects=False)


async def tenant_with_key(api: AsyncTestClient, admin: dict, **extra) -> tuple[dict, dict, str]:
    tenant = await create_tenant(api, admin, **extra)
    key, secret = await create_key(api, admin, tenant["id"])
    return tenant, key, secret
