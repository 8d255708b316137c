"""An engine restart's reason, as the agent reports it (``last_restart_reason`` in a replica report,
``node_metrics.last_restart`` in a heartbeat), reaches the node's health in the admin API: per
replica and as the node's last restart, cleaned of anything that reads like a credential."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

from controlplane.config import Settings
from controlplane.embedded import LOCAL_CATALOG
from controlplane.services.agents import MAX_REASON_CHARS, restart_reason
from tests.agent.conftest import Pool, make_node
from tests.controlplane.factories import unique

HUNG = ("unresponsive: /health_generate failed 3 times in a row over 55.0 s (no answer in 25 s) "
        "while the process lived")


async def node_with_replicas(client, admin: dict, settings: Settings, gpus: int = 2) -> tuple[Pool, str, dict, list[str]]:
    """A local pool, a node with one of its replicas per GPU, registered: (pool, node id, agent headers, replica ids)."""
    r = await client.post("/admin/v1/catalog/import", json=LOCAL_CATALOG, headers=admin)
    assert r.status_code == 200, r.text
    variant = {"tier": "bf16", "model_path": "Qwen/Qwen2.5-0.5B-Instruct", "gpu_memory_gb": 8, "context_length": 4096}
    r = await client.post("/admin/v1/models", json={"name": unique("tiny"), "variants": [variant]}, headers=admin)
    assert r.status_code == 201, r.text
    variant_id = r.json()["variants"][0]["id"]
    r = await client.post("/admin/v1/pools", json={"name": unique("pool"), "variant_id": variant_id,
                                                   "placement": [{"cloud": "local", "region": "local"}],
                                                   "min_replicas": 0, "max_replicas": 4}, headers=admin)
    assert r.status_code == 201, r.text
    pool = Pool(r.json()["id"], variant_id, "")
    node_id, token = make_node(SimpleNamespace(settings=settings), pool, gpus=gpus)
    r = await client.post("/internal/v1/agents/register", json={
        "node_id": node_id, "bootstrap_token": token, "agent_url": "http://127.0.0.1:1", "gpus": list(range(gpus)),
        "engine": "sim"})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = [e["id"] for e in sorted(body["replicas"], key=lambda e: e["gpu_ids"])]
    return pool, node_id, {"Authorization": f"Bearer {body['credential']}"}, ids


def report(rid: str, slot: int, state: str = "ready", **extra) -> dict:
    return {"id": rid, "slot": slot, "state": state, "url": f"http://127.0.0.1:{30000 + slot}", "gpu_ids": [slot],
            **extra}


async def report_restart(client, agent: dict, ids: list[str], reason: str, at: dt.datetime) -> None:
    """A heartbeat in which the first replica was restarted (hung) and the second never was."""
    restarted = report(ids[0], 0, restarts=1, last_exit_code=-9, last_restart_at=at.isoformat(),
                       last_restart_reason=reason)
    r = await client.post("/internal/v1/agents/heartbeat", headers=agent, json={
        "replicas": [restarted, report(ids[1], 1)],
        "node_metrics": {"last_restart": {"replica_id": ids[0], "slot": 0, "at": at.isoformat(), "reason": reason,
                                          "exit_code": -9}}})
    assert r.status_code == 200, r.text


async def test_replica_report_reason_reaches_the_admin_node_view(client, admin, settings):
    _, node_id, agent, ids = await node_with_replicas(client, admin, settings)
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    await report_restart(client, agent, ids, HUNG, at)

    node = (await client.get(f"/admin/v1/nodes/{node_id}", headers=admin)).json()
    health = node["metrics"]["health"]
    assert health["restarts"] == 1
    assert health["last_restart"] == {"replica_id": ids[0], "slot": 0, "at": at.isoformat(), "exit_code": -9,
                                      "reason": HUNG, "restarts": 1}
    assert set(health["replica_restarts"]) == {ids[0]}  # the replica that never restarted has no entry
    assert health["replica_restarts"][ids[0]]["reason"] == HUNG
    assert node["metrics"]["agent"]["last_restart"]["reason"] == HUNG

    # A later report on the replicas endpoint (no reason yet from an older agent) keeps the count, drops the text.
    r = await client.post("/internal/v1/agents/replicas", headers=agent, json={"replicas": [
        report(ids[0], 0, restarts=2, last_exit_code=1, last_restart_at=at.isoformat()), report(ids[1], 1)]})
    assert r.status_code == 200, r.text
    health = (await client.get(f"/admin/v1/nodes/{node_id}", headers=admin)).json()["metrics"]["health"]
    assert health["last_restart"]["reason"] is None and health["last_restart"]["exit_code"] == 1
    assert health["restarts"] == 2


async def test_reasons_are_stored_as_one_bounded_line_without_secrets(client, admin, settings):
    _, node_id, agent, ids = await node_with_replicas(client, admin, settings)
    leaky = ("unresponsive: /health_generate failed 3 times (HTTP 500: bad key nmb_abcd2345_secretsecretsecret "
             "Authorization: Bearer sk-live-123 at http://user:hunter2@10.0.0.1/x api_key=abc)\n<script>x</script>"
             + " pad" * 200)
    await report_restart(client, agent, ids, leaky, dt.datetime.now(dt.UTC))
    node = (await client.get(f"/admin/v1/nodes/{node_id}", headers=admin)).json()
    for stored in (node["metrics"]["health"]["replica_restarts"][ids[0]]["reason"],
                   node["metrics"]["agent"]["last_restart"]["reason"]):
        assert stored.startswith("unresponsive: /health_generate failed 3 times (HTTP 500: bad key [redacted]")
        for secret in ("nmb_abcd", "sk-live-123", "hunter2", "abc)", "\n"):
            assert secret not in stored
        assert "Bearer [redacted]" in stored and "http://[redacted]@10.0.0.1/x" in stored
        assert len(stored) == MAX_REASON_CHARS and stored.endswith("…")


def test_restart_reason_cleaning_leaves_ordinary_reasons_alone():
    for ordinary in (HUNG, "killed by SIGKILL", "exited with code 1 before it was ready", "not ready within 600 s",
                     "token budget exhausted"):
        assert restart_reason(ordinary) == ordinary
    assert restart_reason("  \n ") is None and restart_reason(None) is None and restart_reason(7) is None
    assert restart_reason("a\x00b\tc") == "a b c"
