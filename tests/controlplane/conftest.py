from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from litestar.testing import AsyncTestClient
from pydantic import SecretStr

from controlplane.api.app import create_app
from controlplane.config import Settings
from controlplane.services.signin_throttle import ThrottleSettings

ADMIN_TOKEN = "test-admin-token-0123456789"
EDGE_TOKEN = "test-edge-token-0123456789"


@pytest.fixture
def settings(db_url: str, tmp_path) -> Settings:
    return Settings(
        database_url=db_url,
        admin_token=SecretStr(ADMIN_TOKEN),
        edge_token=SecretStr(EDGE_TOKEN),
        state_dir=tmp_path / "state",
        key_cache_seconds=5.0,
        # Sign-in throttling counts in the shared Redis: each test gets its own keys.
        signin_throttle=isolated_throttle(),
    )


def isolated_throttle(**overrides) -> ThrottleSettings:
    return ThrottleSettings(key_prefix=f"nimbus-test:{uuid.uuid4().hex}:", **overrides)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[AsyncTestClient]:
    app = create_app(settings)
    async with AsyncTestClient(app=app) as c:
        yield c


@pytest.fixture
def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
