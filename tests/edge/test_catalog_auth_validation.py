"""Pure parts: snapshot -> catalog, key auth, request validation, standalone config, settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from dataplane.edge import errors
from dataplane.edge.auth import authenticate
from dataplane.edge.catalog import Catalog
from dataplane.edge.cli import build_parser, resolve
from dataplane.edge.settings import EdgeSettings
from dataplane.edge.standalone import config_to_snapshot, key_sha256
from dataplane.edge.validation import (
    CHAT,
    COMPLETION,
    TokenEstimator,
    check_context,
    parse_json,
    upstream_body,
    validate,
)

KEY_A, KEY_B, KEY_X = "nmb_aaaaaaaa_secret-a", "nmb_bbbbbbbb_secret-b", "nmb_xxxxxxxx_secret-x"


def snapshot(**over):
    snap = {
        "etag": "e1",
        "tenants": [
            {"id": "t-a", "name": "a", "status": "active", "weight": 2.0, "limits": {"requests_per_minute": 10},
             "response_cache": True},
            {"id": "t-b", "name": "b", "status": "suspended", "limits": {}},
        ],
        "keys": [
            {"id": "k-a", "tenant_id": "t-a", "prefix": "nmb_aaaaaaaa", "sha256": key_sha256(KEY_A),
             "scopes": ["inference"], "expires_at": None, "priority": "batch"},
            {"id": "k-b", "tenant_id": "t-b", "prefix": "nmb_bbbbbbbb", "sha256": key_sha256(KEY_B),
             "scopes": ["inference"], "expires_at": None},
            {"id": "k-x", "tenant_id": "t-a", "prefix": "nmb_xxxxxxxx", "sha256": key_sha256(KEY_X),
             "scopes": ["admin"], "expires_at": None},
        ],
        "models": [{"name": "llama", "default_tier": "bf16", "variants": [
            {"id": "v-bf16", "tier": "bf16", "context_length": 4096, "served_model_name": "llama-bf16"},
            {"id": "v-fp8", "tier": "fp8", "context_length": 4096, "served_model_name": "llama-fp8"},
        ]}, {"name": "private", "variants": [
            {"id": "v-priv", "tier": "bf16", "context_length": 4096, "served_model_name": "private"}]}],
        "pools": [
            {"id": "p-bf16", "variant_id": "v-bf16", "kind": "warm", "dedicated_tenant_id": None},
            {"id": "p-fp8", "variant_id": "v-fp8", "kind": "scale_to_zero", "dedicated_tenant_id": None},
            {"id": "p-priv", "variant_id": "v-priv", "kind": "warm", "dedicated_tenant_id": "t-b"},
        ],
        "replicas": [
            {"id": "r1", "pool_id": "p-bf16", "variant_id": "v-bf16", "region": "aws/x", "url": "http://h1/",
             "state": "ready", "max_running_requests": 8, "max_total_tokens": 1000, "metrics": {}},
            {"id": "r2", "pool_id": "p-bf16", "variant_id": "v-bf16", "region": "aws/x", "url": "http://h2",
             "state": "draining", "max_running_requests": 8, "max_total_tokens": 1000},
        ],
        "regions": [{"name": "aws/x", "rtt_ms": 3.5}],
    }
    snap.update(over)
    return snap


def test_model_tier_resolution_and_dedicated_pools():
    cat = Catalog.from_snapshot(snapshot())
    assert cat.resolve_model("llama")[1].id == "v-bf16"
    assert cat.resolve_model("llama:fp8")[1].served_model_name == "llama-fp8"
    assert cat.resolve_model("llama:int4") is None
    assert cat.resolve_model("nope") is None
    # another tenant's dedicated pool is invisible; the owner sees it
    assert cat.usable_pools("t-a", "v-priv") == []
    assert [p.id for p in cat.usable_pools("t-b", "v-priv")] == ["p-priv"]
    assert {m.name for m, _ in cat.visible_models("t-a")} == {"llama"}
    # only ready replicas are candidates, and the url lost its trailing slash
    assert [r.url for r in cat.candidates("t-a", "v-bf16")] == ["http://h1"]
    assert cat.rtt_ms("aws/x") == 3.5


def test_a_tenant_queues_by_the_tightest_ttft_slo_among_the_pools_it_may_use():
    pools = [
        {"id": "p-shared", "variant_id": "v-bf16", "kind": "warm", "dedicated_tenant_id": None, "ttft_slo_ms": 2000},
        {"id": "p-own", "variant_id": "v-bf16", "kind": "warm", "dedicated_tenant_id": "t-b", "ttft_slo_ms": 500},
        {"id": "p-fp8", "variant_id": "v-fp8", "kind": "warm", "dedicated_tenant_id": None},
    ]
    cat = Catalog.from_snapshot(snapshot(pools=pools))
    assert cat.ttft_slo_s("t-a", "v-bf16") == 2.0  # another tenant's dedicated pool does not bind it
    assert cat.ttft_slo_s("t-b", "v-bf16") == 0.5
    assert cat.ttft_slo_s("t-a", "v-fp8") is None  # no SLO: its queue keeps arrival order


def test_authentication_outcomes():
    cat = Catalog.from_snapshot(snapshot())
    tenant, key = authenticate(cat, f"Bearer {KEY_A}")
    assert (tenant.id, key.id, key.priority, tenant.weight) == ("t-a", "k-a", "batch", 2.0)
    for header in (None, "Basic abc", "Bearer nmb_aaaaaaaa_wrong"):
        with pytest.raises(errors.EdgeError) as exc:
            authenticate(cat, header)
        assert exc.value.status == 401
    with pytest.raises(errors.EdgeError) as exc:
        authenticate(cat, f"Bearer {KEY_B}")
    assert (exc.value.status, exc.value.code) == (403, "tenant_suspended")
    with pytest.raises(errors.EdgeError) as exc:
        authenticate(cat, f"Bearer {KEY_X}")
    assert (exc.value.status, exc.value.code) == (403, "insufficient_scope")


def test_expired_and_revoked_keys_are_401():
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    snap = snapshot()
    snap["keys"][0]["expires_at"] = past
    with pytest.raises(errors.EdgeError) as exc:
        authenticate(Catalog.from_snapshot(snap), f"Bearer {KEY_A}")
    assert exc.value.status == 401 and "expired" in exc.value.message
    revoked = snapshot()
    revoked["keys"] = revoked["keys"][1:]
    with pytest.raises(errors.EdgeError) as exc:
        authenticate(Catalog.from_snapshot(revoked), f"Bearer {KEY_A}")
    assert exc.value.status == 401


def test_error_body_is_openai_shaped():
    body = msgspec.json.decode(errors.model_not_found("x").body())
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 100}, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "priority": "vip"}, "priority"),
])
def test_chat_validation_rejects_with_param(body, param):
    with pytest.raises(errors.EdgeError) as exc:
        validate(CHAT, body, TokenEstimator())
    assert exc.value.status == 400 and exc.value.param == param


def test_validation_facts_and_upstream_body():
    est = TokenEstimator(4.0)
    req = validate(CHAT, {"model": "llama:fp8", "messages": [{"role": "system", "content": "s" * 400},
                                                            {"role": "user", "content": "hi"}],
                          "max_tokens": 50, "stream": True, "temperature": 0, "priority": "batch"}, est)
    assert req.prompt_text.startswith("<|system|>" + "s" * 400)
    assert 100 <= req.prompt_tokens_est <= 110 and req.max_tokens == 50 and req.reserved_tokens > 150
    assert req.stream and not req.include_usage and req.deterministic and req.priority == "batch"
    sent = msgspec.json.decode(upstream_body(req, "llama-fp8"))
    assert sent["model"] == "llama-fp8" and "priority" not in sent
    assert sent["stream_options"] == {"include_usage": True}
    comp = validate(COMPLETION, {"model": "m", "prompt": "abc"}, est)
    assert comp.prompt_text == "abc" and not comp.stream
    with pytest.raises(errors.EdgeError):
        validate(COMPLETION, {"model": "m", "prompt": ["a", "b"]}, est)


def test_context_and_size_limits():
    est = TokenEstimator(4.0)
    req = validate(CHAT, {"model": "m", "messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 100},
                   est)
    check_context(req, 4096)
    with pytest.raises(errors.EdgeError) as exc:
        check_context(req, 1000)
    assert exc.value.code == "context_length_exceeded"
    big = validate(CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}, est)
    with pytest.raises(errors.EdgeError):
        check_context(big, 4096)
    with pytest.raises(errors.EdgeError) as exc:
        parse_json(b"{" + b" " * 100 + b"}", 50)
    assert exc.value.status == 413
    with pytest.raises(errors.EdgeError) as exc:
        parse_json(b"{not json", 50)
    assert exc.value.status == 400
    with pytest.raises(errors.EdgeError):
        parse_json(b"[1]", 50)


def test_token_estimator_calibrates_towards_reports():
    est = TokenEstimator(4.0)
    for _ in range(300):
        est.observe(6000, 1000)  # the engine says 6 chars per token
    assert 5.8 < est.chars_per_token < 6.0


def test_standalone_config_becomes_a_catalog():
    cfg = {
        "regions": [{"name": "local", "rtt_ms": 0.1}],
        "models": [{"name": "demo", "tiers": [
            {"tier": "bf16", "replicas": ["http://a:1", {"url": "http://b:2", "region": "far",
                                                         "max_running_requests": 4}]},
            {"tier": "fp8", "served_model_name": "demo-fp8", "replicas": []}]}],
        "tenants": [{"name": "acme", "weight": 3, "limits": {"requests_per_minute": 5},
                     "keys": [{"dev_key": KEY_A}, {"sha256": key_sha256(KEY_B).upper(), "priority": "batch"}]}],
    }
    snap = config_to_snapshot(cfg)
    assert snap == config_to_snapshot(cfg)  # ids and etag are stable
    cat = Catalog.from_snapshot(snap)
    tenant, _key = authenticate(cat, f"Bearer {KEY_A}")
    assert tenant.name == "acme" and tenant.weight == 3 and tenant.limits.requests_per_minute == 5
    assert authenticate(cat, f"Bearer {KEY_B}")[1].priority == "batch"
    _, variant = cat.resolve_model("demo")
    reps = cat.candidates(tenant.id, variant.id)
    assert [r.region for r in reps] == ["local", "far"] and reps[1].max_running_requests == 4
    assert cat.rtt_ms("far") is None
    assert cat.resolve_model("demo:fp8")[1].served_model_name == "demo-fp8"
    assert KEY_A not in str(snap)  # plaintext never lands in the snapshot


def test_settings_precedence(tmp_path):
    cfg = tmp_path / "edge.json"
    cfg.write_text('{"settings": {"queue_timeout_s": 7, "policy": "least_load"}, "models": [], "tenants": []}')
    args = build_parser().parse_args(["--config", str(cfg), "--port", "9999", "--set", "capacity_factor=0.5",
                                      "--redis-url", "none"])
    settings, _ = resolve(args, {"NIMBUS_EDGE_QUEUE_TIMEOUT_S": "9", "NIMBUS_EDGE_POLICY": "round_robin"})
    assert settings.queue_timeout_s == 9.0  # env beats the file
    assert settings.policy == "round_robin"
    assert settings.port == 9999 and settings.capacity_factor == 0.5 and settings.redis_url is None
    assert EdgeSettings().merged({"max_inflight_per_replica": "none"}).max_inflight_per_replica is None
