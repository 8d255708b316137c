"""The agent API against a real control plane on Postgres: one-time tokens, scoped credentials,
the replica list in every answer, replica reports, heartbeats with commands, and drains."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import httpx

from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import writes
from controlplane.models import Node, Replica
from controlplane.services.secrets import sha256_hex
from tests.agent.conftest import EDGE_TOKEN, ControlPlane, make_node, make_pool

FACTS = {"agent_url": "http://127.0.0.1:1", "hostname": "gpu-1", "gpus": [0, 1], "engine": "sim", "version": "t"}


def register(cp: ControlPlane, node_id: str, token: str) -> httpx.Response:
    return cp.post("/internal/v1/agents/register", {"node_id": node_id, "bootstrap_token": token, **FACTS})


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def replica(rid: str, state: str = "ready", **extra) -> dict:
    """A report of the control plane's replica ``rid`` (reports of ids not placed on the node are ignored)."""
    return {"id": rid, "slot": 0, "state": state, "url": "http://127.0.0.1:30000", "gpu_ids": [0],
            "model_ready_seconds": 3.5, "ready_breakdown": {"download": 1.0, "load": 2.0, "warmup": 0.5},
            "max_running_requests": 64, "max_total_tokens": 100000, **extra}


def snapshot(cp: ControlPlane) -> dict:
    r = cp.http.get(cp.url + "/internal/v1/edge/snapshot", headers=bearer(EDGE_TOKEN))
    assert r.status_code == 200
    return r.json()


def routable(cp: ControlPlane, expect=None) -> list[dict]:
    """The snapshot's replicas once ``expect(replicas)`` holds; without ``expect``, a snapshot built
    after this call (the API caches snapshots for up to 1 s)."""
    if expect is None:
        time.sleep(1.1)
        return snapshot(cp)["replicas"]
    deadline = time.monotonic() + 5
    while True:
        replicas = snapshot(cp)["replicas"]
        if expect(replicas) or time.monotonic() > deadline:
            return replicas
        time.sleep(0.1)


def test_bootstrap_token_is_exchanged_once_for_a_hashed_credential(cp: ControlPlane):
    pool = make_pool(cp, engine_args={"mem_fraction_static": 0.8})
    node_id, token = make_node(cp, pool, gpus=2)

    r = register(cp, node_id, token)
    assert r.status_code == 200, r.text
    body = r.json()
    credential = body["credential"]
    assert "assignment" not in body and body["node_id"] == node_id and body["node_state"] == "booting"
    listed = body["replicas"]
    assert sorted(e["gpu_ids"] for e in listed) == [[0], [1]] and len({e["id"] for e in listed}) == 2
    for e in listed:
        assert e["served_model_name"] == pool.served_model_name and e["model_path"] == "Qwen/Qwen2.5-0.5B-Instruct"
        assert e["engine_args"] == {"mem_fraction_static": 0.8} and e["desired_state"] == "running"
        assert e["pool_id"] == pool.id and e["variant_id"] == pool.variant_id and e["drain_deadline_s"] > 0
    with session_scope(cp.settings) as s:
        node = s.get(Node, uuid.UUID(node_id))
        assert node.credential_sha256 == sha256_hex(credential)  # only the hash is stored
        assert node.agent_url == FACTS["agent_url"] and node.state.value == "booting"

    again = register(cp, node_id, token)  # a retry (its answer was lost): the same credential
    assert again.status_code == 200 and again.json()["credential"] == credential
    ok = cp.post("/internal/v1/agents/heartbeat", {"replicas": []}, headers=bearer(credential))
    assert ok.status_code == 200 and ok.json()["commands"] == []
    assert {e["id"] for e in ok.json()["replicas"]} == {e["id"] for e in listed}  # every answer carries the list
    assert register(cp, node_id, token).status_code == 401  # the token is spent once the credential is used
    with session_scope(cp.settings) as s:
        node = s.get(Node, uuid.UUID(node_id))
        assert node.bootstrap_token_sha256 is None and node.bootstrap_salt is None


def test_expired_wrong_and_foreign_tokens_are_refused_alike(cp: ControlPlane):
    pool = make_pool(cp)
    expired_node, expired_token = make_node(cp, pool, ttl_s=-1)
    node_a, token_a = make_node(cp, pool)
    node_b, _ = make_node(cp, pool)

    answers = [register(cp, expired_node, expired_token), register(cp, node_a, "not-the-token"),
               register(cp, node_b, token_a), register(cp, str(uuid.uuid4()), token_a)]
    assert [a.status_code for a in answers] == [401, 401, 401, 401]
    assert len({a.json()["detail"] for a in answers}) == 1  # nothing tells which check failed
    assert cp.post("/internal/v1/agents/heartbeat", {}, headers=bearer("made-up")).status_code == 401
    assert register(cp, node_a, token_a).status_code == 200  # the failed attempts did not burn it


def placed(answer: dict) -> str:
    """The id of the one replica an answer lists."""
    (entry,) = answer["replicas"]
    return entry["id"]


def test_replicas_register_and_reach_the_edge_snapshot_and_node_turns_ready(cp: ControlPlane):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool)
    answer = register(cp, node_id, token).json()
    credential = answer["credential"]
    starting = replica(placed(answer), "starting")
    r = cp.post("/internal/v1/agents/replicas", {"replicas": [starting]}, headers=bearer(credential))
    assert r.status_code == 200 and r.json() == {"applied": 1}
    assert routable(cp) == []  # not routable until ready

    ready = {**starting, "state": "ready", "metrics": {"num_running_reqs": 2, "num_queue_reqs": 1}}
    hb = cp.post("/internal/v1/agents/heartbeat", {"replicas": [ready], "node_metrics": {"in_flight": 3}},
                 headers=bearer(credential))
    assert hb.status_code == 200, hb.text
    snap = routable(cp, bool)
    assert [(x["id"], x["url"], x["state"]) for x in snap] == [(ready["id"], ready["url"], "ready")]
    assert snap[0]["metrics"] == {"num_running_reqs": 2, "num_queue_reqs": 1}
    node = cp.get_admin(f"/admin/v1/nodes/{node_id}")
    assert node["state"] == "ready" and node["metrics"]["agent"]["in_flight"] == 3
    rep = cp.get_admin(f"/admin/v1/replicas?node_id={node_id}")["items"][0]
    assert rep["ready_breakdown"] == {"download": 1.0, "load": 2.0, "warmup": 0.5} and rep["model_ready_seconds"] == 3.5


def test_a_credential_writes_only_its_own_node(cp: ControlPlane):
    pool = make_pool(cp)
    (a, ta), (b, tb) = make_node(cp, pool), make_node(cp, pool)
    cred_a = register(cp, a, ta).json()["credential"]
    answer_b = register(cp, b, tb).json()
    cred_b = answer_b["credential"]
    theirs = replica(placed(answer_b))
    assert cp.post("/internal/v1/agents/replicas", {"replicas": [theirs]}, headers=bearer(cred_b)).status_code == 200

    hijack = {**theirs, "url": "http://evil:1"}
    r = cp.post("/internal/v1/agents/replicas", {"replicas": [hijack]}, headers=bearer(cred_a))
    assert r.status_code == 409
    rows = cp.get_admin(f"/admin/v1/replicas?node_id={b}")["items"]
    assert [x["url"] for x in rows] == [theirs["url"]]


def test_restart_reports_show_on_the_node_health(cp: ControlPlane):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool)
    answer = register(cp, node_id, token).json()
    credential = answer["credential"]
    at = dt.datetime.now(dt.UTC).isoformat()
    crashed = replica(placed(answer), "starting", restarts=1, last_exit_code=-9, last_restart_at=at)
    cp.post("/internal/v1/agents/heartbeat", {"replicas": [crashed]}, headers=bearer(credential))
    health = cp.get_admin(f"/admin/v1/nodes/{node_id}")["metrics"]["health"]
    assert health["restarts"] == 1 and health["last_restart"]["exit_code"] == -9
    assert health["last_restart"]["replica_id"] == crashed["id"]


def test_admin_drain_stops_routing_at_once_and_commands_the_agent(cp: ControlPlane):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool)
    answer = register(cp, node_id, token).json()
    credential = answer["credential"]
    ready = replica(placed(answer), "ready")
    cp.post("/internal/v1/agents/heartbeat", {"replicas": [ready]}, headers=bearer(credential))
    assert len(routable(cp, bool)) == 1

    r = cp.post(f"/admin/v1/nodes/{node_id}/drain", {"deadline_s": 60}, headers=cp.admin)
    assert r.status_code == 202 and r.json()["state"] == "draining"
    drained = routable(cp, lambda rs: [x["state"] for x in rs] == ["draining"])
    assert [x["state"] for x in drained] == ["draining"]  # edges take no new work here

    # A lagging agent still says "ready": the control plane keeps it out of rotation.
    hb = cp.post("/internal/v1/agents/heartbeat", {"replicas": [ready]}, headers=bearer(credential)).json()
    assert hb["commands"][0]["type"] == "drain" and 50 < hb["commands"][0]["deadline_s"] <= 60
    assert [x["state"] for x in routable(cp)] == ["draining"]
    assert cp.post(f"/admin/v1/nodes/{node_id}/drain", {}, headers=cp.admin).status_code == 202  # idempotent
    assert cp.post(f"/admin/v1/nodes/{node_id}/drain", {}).status_code == 401  # admin only
    audit = cp.get_admin("/admin/v1/audit?action=node.draining")["items"]
    assert [a["target_id"] for a in audit] == [node_id]


def test_agent_sigterm_drain_moves_the_node_to_draining(cp: ControlPlane):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool)
    answer = register(cp, node_id, token).json()
    credential, rid = answer["credential"], placed(answer)
    cp.post("/internal/v1/agents/heartbeat", {"replicas": [replica(rid, "ready")]}, headers=bearer(credential))
    hb = cp.post("/internal/v1/agents/heartbeat", {"draining": True, "drain_deadline_s": 30,
                                                   "replicas": [replica(rid, "draining")]}, headers=bearer(credential))
    assert hb.json()["commands"][0]["type"] == "drain"
    assert cp.get_admin(f"/admin/v1/nodes/{node_id}")["state"] == "draining"


def test_resume_keeps_the_credential_and_lists_the_wanted_replicas_again(cp: ControlPlane):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool)
    answer = register(cp, node_id, token).json()
    credential = answer["credential"]
    old = replica(placed(answer), "ready")
    cp.post("/internal/v1/agents/replicas", {"replicas": [old]}, headers=bearer(credential))
    assert len(routable(cp, bool)) == 1
    r = cp.post("/internal/v1/agents/resume", FACTS, headers=bearer(credential))
    assert r.status_code == 200 and "credential" not in r.json()
    # Its engine died with the old agent: not routable, pending, and listed to be started again.
    (entry,) = r.json()["replicas"]
    assert entry["id"] == old["id"] and entry["desired_state"] == "running"
    assert entry["served_model_name"] == pool.served_model_name
    states = {x["id"]: x["state"] for x in cp.get_admin(f"/admin/v1/replicas?node_id={node_id}")["items"]}
    assert states == {old["id"]: "pending"}
    assert routable(cp, lambda rs: not rs) == []


def test_a_replica_told_to_stop_is_listed_stopped_until_reported_stopped(cp: ControlPlane):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool, gpus=2)
    answer = register(cp, node_id, token).json()
    credential = answer["credential"]
    keep, stop = (e["id"] for e in answer["replicas"])
    hb = {"replicas": [replica(keep, "ready"), replica(stop, "ready")]}
    cp.post("/internal/v1/agents/heartbeat", hb, headers=bearer(credential))
    with session_scope(cp.settings) as s:
        row = s.get(Replica, uuid.UUID(stop))
        writes.stop_replica(row, {row.node_id: s.get(Node, row.node_id)}, utcnow(), cp.settings, reason="test")
    listed = cp.post("/internal/v1/agents/heartbeat", hb, headers=bearer(credential)).json()["replicas"]
    assert {e["id"]: e["desired_state"] for e in listed} == {keep: "running", stop: "stopped"}
    assert 0 < next(e for e in listed if e["id"] == stop)["drain_deadline_s"] <= cp.settings.drain_timeout_s
    # A lagging agent still says "ready": the control plane keeps it out of rotation.
    assert {x["id"]: x["state"] for x in routable(cp)} == {keep: "ready", stop: "draining"}
    done = {"replicas": [replica(keep, "ready"), replica(stop, "stopped")]}
    listed = cp.post("/internal/v1/agents/heartbeat", done, headers=bearer(credential)).json()["replicas"]
    assert [e["id"] for e in listed] == [keep]  # stopped and told: no longer listed, the agent forgets it
