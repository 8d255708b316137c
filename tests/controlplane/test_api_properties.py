"""Property-based API testing: schemathesis generates requests (valid and invalid) from the
served OpenAPI schema against a real uvicorn + Postgres; no 5xx, every response matches the schema."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from pydantic import SecretStr
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from controlplane.api.app import create_app
from controlplane.config import Settings
from tests.controlplane import factories
from tests.controlplane.conftest import ADMIN_TOKEN, EDGE_TOKEN
from tests.live_server import serve

CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


@pytest.fixture(scope="module")
def live_api(pg_database, tmp_path_factory):
    settings = Settings(database_url=pg_database, admin_token=SecretStr(ADMIN_TOKEN),
                        edge_token=SecretStr(EDGE_TOKEN), state_dir=tmp_path_factory.mktemp("state"))
    with serve(create_app(settings)) as url:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        with httpx.Client(base_url=url, headers=admin) as c:
            assert c.post("/admin/v1/catalog/import", json=factories.catalog()).status_code == 200
            tenant = c.post("/admin/v1/tenants", json={"name": "prop-tenant"}).json()
            created = c.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={"scopes": ["inference", "manage"]}).json()
            spare = c.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={"scopes": ["inference"]}).json()
            model = c.post("/admin/v1/models", json={"name": "prop-model", "variants": [
                {"tier": "bf16", "model_path": "m", "gpu_memory_gb": 10, "context_length": 4096}]}).json()
            pool = c.post("/admin/v1/pools", json={
                "name": "prop-pool", "variant_id": model["variants"][0]["id"],
                "placement": [{"cloud": "aws", "region": "us-east-1"}]}).json()
        # Real ids, so generated requests reach existing rows instead of stopping at 404.
        known = {"tenant_id": tenant["id"], "key_id": spare["key"]["id"], "model_id": model["id"],
                 "variant_id": model["variants"][0]["id"], "pool_id": pool["id"]}
        yield url, created["secret"], known
    from tests.conftest import truncate_all

    truncate_all(pg_database)


def _run_all(live_api, path_regex: str, auth: str) -> None:
    url, tenant_secret, known = live_api
    schema = schemathesis.openapi.from_url(f"{url}/schema/openapi.json")
    token = ADMIN_TOKEN if auth == "admin" else tenant_secret
    failures: list[str] = []
    for op_result in schema.include(path_regex=path_regex).get_all_operations():
        operation = op_result.ok()
        strategy = st.one_of(
            operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE),
            operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE),
        )

        @hyp_settings(max_examples=40, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
        @given(case=strategy, use_known_ids=st.booleans())
        def check(case, use_known_ids: bool) -> None:
            if use_known_ids and case.method.upper() != "DELETE":
                for name in list(case.path_parameters or {}):
                    if name in known:
                        case.path_parameters[name] = known[name]
            case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=CHECKS)

        try:
            check()
        except Exception as exc:  # collect all, report together
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:800]}")
    assert not failures, "\n\n".join(failures)


def test_admin_api_never_5xx_and_matches_schema(live_api) -> None:
    _run_all(live_api, r"^/admin/v1/", "admin")


def test_tenant_api_never_5xx_and_matches_schema(live_api) -> None:
    _run_all(live_api, r"^/v1/tenant/", "tenant")
