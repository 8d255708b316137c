"""Model-level readiness (issue 20, item 7): ``/health/models/{model}`` and ``/health/ready`` fail
(503, a JSON reason) when a model has no healthy replica or the snapshot is too old; ``/health``
stays the process's liveness."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

from .conftest import cp_snapshot, make_key, port_is_closed


def get(edge, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(edge.url + path, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def until(edge, path: str, status: int, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        code, body = get(edge, path)
        if code == status or time.monotonic() > deadline:
            assert code == status, (path, code, body)
            return body
        time.sleep(0.1)


def with_model(snap: dict, name: str, urls: list[str], kind: str = "warm") -> dict:
    vid, pid = str(uuid.uuid4()), str(uuid.uuid4())
    snap["models"].append({"name": name, "default_tier": "bf16", "variants": [
        {"id": vid, "tier": "bf16", "context_length": 8192, "served_model_name": name}]})
    snap["pools"].append({"id": pid, "variant_id": vid, "kind": kind, "dedicated_tenant_id": None})
    snap["replicas"] += [{"id": str(uuid.uuid4()), "pool_id": pid, "variant_id": vid, "region": "local/a",
                          "url": u, "state": "ready", "max_running_requests": 8, "max_total_tokens": 10000,
                          "metrics": {}} for u in urls]
    return snap


def test_readiness_fails_without_a_healthy_replica_and_with_a_stale_snapshot(edge_factory, control_plane, sims):
    key = make_key("health")
    snap = cp_snapshot([sims[0].url], [key])
    with_model(snap, "broken", [f"http://127.0.0.1:{port_is_closed()}"])  # its only replica is dead
    with_model(snap, "empty", [])  # a warm pool with no replica
    with_model(snap, "lazy", [], kind="scale_to_zero")  # starts on demand: servable
    cp = control_plane(snap)
    edge = edge_factory(None, control_plane_url=cp.url, env={"NIMBUS_EDGE_TOKEN": cp.token}, redis_url="none",
                        settings={"health_interval_s": 0.2, "health_timeout_s": 1, "snapshot_poll_s": 0.2,
                                  "health_snapshot_max_age_s": 2})

    code, body = get(edge, "/health/models/demo")
    assert code == 200 and body["ok"] and body["tiers"]["bf16"]["healthy_replicas"] == 1, body
    assert get(edge, "/health/models/demo:bf16")[0] == 200
    assert get(edge, "/health/models/lazy")[0] == 200
    body = until(edge, "/health/models/broken", 503)  # once its probes failed
    assert body["reason"] == "no_healthy_replica" and body["tiers"]["bf16"]["ready_replicas"] == 1, body
    code, body = get(edge, "/health/models/empty")
    assert code == 503 and body["reason"] == "no_healthy_replica"
    code, body = get(edge, "/health/models/nope")
    assert code == 503 and body["reason"] == "unknown_model"
    code, body = get(edge, "/health/ready")
    assert code == 503 and body["failing"] == ["broken", "empty"] and body["models"]["demo"]["ok"], body

    # The control plane drops the broken models: the region is ready.
    cp.set_snapshot(cp_snapshot([sims[0].url], [key]))
    body = until(edge, "/health/ready", 200)
    assert set(body["models"]) == {"demo"} and body["snapshot_age_s"] < 2

    # The control plane goes away: the edge keeps serving from its snapshot, but once that is
    # older than health_snapshot_max_age_s the region and its models report it.
    cp.stop()
    body = until(edge, "/health/ready", 503, timeout=10)
    assert body["reason"] == "snapshot_stale" and body["snapshot_age_s"] >= 2, body
    code, body = get(edge, "/health/models/demo")
    assert code == 503 and body["reason"] == "snapshot_stale"
    assert get(edge, "/health")[0] == 200  # liveness is not readiness
