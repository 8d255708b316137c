"""Property-based API testing: schemathesis generates requests (valid and invalid) from the
served OpenAPI schema against a real uvicorn + Postgres; no 5xx, every response matches the schema.
Every operation that takes a body also gets hostile raw bodies (nested past the depth limit, over
the size limit, big within it): 400 naming the body, 413, never a 5xx."""

from __future__ import annotations

import re

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
from controlplane.api.bodies import CATALOG_MAX_BODY_BYTES, MAX_BODY_BYTES, MAX_JSON_DEPTH, json_depth_exceeds
from controlplane.config import Settings
from tests.controlplane import factories
from tests.controlplane.conftest import ADMIN_TOKEN, EDGE_TOKEN, isolated_throttle
from tests.live_server import serve

CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


@pytest.fixture(scope="module")
def live_api(pg_database, tmp_path_factory):
    settings = Settings(database_url=pg_database, admin_token=SecretStr(ADMIN_TOKEN),
                        edge_token=SecretStr(EDGE_TOKEN), state_dir=tmp_path_factory.mktemp("state"),
                        signin_throttle=isolated_throttle())
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


def _nest(depth: int, shape: str, leaf: bytes = b"1") -> bytes:
    if shape == "array":
        return b"[" * depth + leaf + b"]" * depth
    if shape == "object":
        return b'{"k":' * depth + leaf + b"}" * depth
    half = depth // 2  # alternating [{"k":[{"k":...
    return b'[{"k":' * half + leaf + b"}]" * half


def _limit_for(path: str) -> int:
    return CATALOG_MAX_BODY_BYTES if path.endswith("/catalog/import") else MAX_BODY_BYTES


@st.composite
def hostile_body(draw, path: str) -> bytes:
    """Raw JSON bytes: nested past the depth limit (alone or inside a plausible object), over the
    route's size limit, or big but within it (long strings, long arrays)."""
    kind = draw(st.sampled_from(["deep", "deep_in_field", "huge", "big_string", "big_array"]))
    if kind in ("deep", "deep_in_field"):
        depth = draw(st.one_of(st.integers(MAX_JSON_DEPTH + 1, 300), st.sampled_from([1_000, 10_000, 200_000])))
        inner = _nest(depth, draw(st.sampled_from(["array", "object", "mixed"])))
        if kind == "deep":
            return inner
        field = draw(st.sampled_from(["name", "scopes", "placement", "variants", "clouds", "metadata", "x"]))
        return b'{"name": "n", "' + field.encode() + b'": ' + inner + b"}"
    limit = _limit_for(path)
    if kind == "huge":
        return b'{"name": "' + b"x" * (limit + draw(st.integers(0, 4096))) + b'"}'
    if kind == "big_string":
        field = draw(st.sampled_from(["name", "email", "model_path", "version"]))
        return b'{"' + field.encode() + b'": "' + b"y" * draw(st.integers(100_000, MAX_BODY_BYTES - 100)) + b'"}'
    n = draw(st.integers(10_000, 150_000))
    return b'{"name": "n", "scopes": [' + b",".join([b'"manage"'] * n) + b"]}"


def _hostile_checks(operation, token: str, max_examples: int, failures: list[str]) -> int:
    sent: list[int] = []

    @hyp_settings(max_examples=max_examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
    @given(raw=hostile_body(operation.path))
    def check(raw: bytes) -> None:
        # Ids of no row: the limits hold before any lookup, and the shared rows stay as they are.
        path_parameters = {name: "00000000-0000-0000-0000-000000000000"
                           for name in re.findall(r"{(\w+)}", operation.path)}
        case = operation.Case(path_parameters=path_parameters, body={}, media_type="application/json")
        response = case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=CHECKS, data=raw)
        sent.append(1)
        assert response.status_code < 500
        if len(raw) > _limit_for(operation.path):
            assert response.status_code == 413, response.status_code
        elif json_depth_exceeds(raw):
            assert response.status_code == 400 and response.json()["errors"][0]["field"] == "body", \
                response.text[:300]

    try:
        check()
    except Exception as exc:  # collect all, report together
        failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:800]}")
    return len(sent)


def _run_hostile(live_api, path_regex: str, auth: str, max_examples: int) -> int:
    """Every operation with a JSON body gets deep and huge raw bodies; returns the cases sent."""
    url, tenant_secret, _ = live_api
    schema = schemathesis.openapi.from_url(f"{url}/schema/openapi.json")
    token = ADMIN_TOKEN if auth == "admin" else tenant_secret
    failures: list[str] = []
    sent = 0
    for op_result in schema.include(path_regex=path_regex).get_all_operations():
        operation = op_result.ok()
        if not len(operation.body):  # routes that take no body never read one
            continue
        sent += _hostile_checks(operation, token, max_examples, failures)
    assert not failures, "\n\n".join(failures)
    return sent


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # the MiB-sized examples' repr
def test_deep_and_huge_bodies_never_5xx(live_api) -> None:
    """Deep nesting: 400 naming the body; over the size limit: 413; big within it: never a 5xx."""
    sent = _run_hostile(live_api, r"^/admin/v1/", "admin", max_examples=12)
    sent += _run_hostile(live_api, r"^/v1/tenant/", "tenant", max_examples=12)
    assert sent >= 100, sent
    print(f"hostile bodies: {sent} cases")


def test_admin_api_never_5xx_and_matches_schema(live_api) -> None:
    _run_all(live_api, r"^/admin/v1/", "admin")


def test_tenant_api_never_5xx_and_matches_schema(live_api) -> None:
    _run_all(live_api, r"^/v1/tenant/", "tenant")
