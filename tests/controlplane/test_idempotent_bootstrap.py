"""Idempotent bootstrap on the real control plane (Postgres, uvicorn): a register whose answer is
lost after the server committed it is retried with the same token and gets the same credential;
the node lives on; the token dies once the credential is used (401 after), or when the grace
period after the first register ends."""

# ruff: noqa: F811  (the fixture "cp" is imported, then named as test arguments)
from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
import uuid

import httpx
import pytest

from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.migrate import upgrade
from controlplane.db.types import utcnow
from controlplane.models import Node, NodeState
from controlplane.services import agents
from controlplane.services.errors import Unauthorized
from controlplane.services.secrets import new_token, sha256_hex
from dataplane.agent.process import AgentProcess
from tests.agent.conftest import (
    FAST_AGENT_ENV,
    ControlPlane,
    agent_config,
    cp,  # noqa: F401 (the fixture)
    make_node,
    make_pool,
)
from tests.forwarding_proxy import ForwardingProxy

FACTS = {"agent_url": "http://127.0.0.1:1", "hostname": "gpu-1", "gpus": [0], "engine": "sim", "version": "t"}


class AnswerDroppingProxy(ForwardingProxy):
    """Forwards every request to the control plane and, for the first ``drop`` requests to a path
    ending in ``drop_path``, waits for the full answer (the server has committed) and then closes
    the client's connection without sending it."""

    protocol_version = "HTTP/1.1"

    def __init__(self, upstream: str, drop_path: str, drop: int = 1) -> None:
        super().__init__(upstream)
        self.drop_path, self.left = drop_path, drop
        self.dropped: list[int] = []  # status codes of the answers thrown away
        self.passed: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def deliver(self, path: str, body: bytes, answer: httpx.Response) -> bool:
        with self._lock:
            drop = path.endswith(self.drop_path) and self.left > 0
            if drop:
                self.left -= 1
                self.dropped.append(answer.status_code)
            else:
                self.passed.append((path, answer.status_code))
        return not drop


def register(url: str, node_id: str, token: str) -> httpx.Response:
    return httpx.post(url + "/internal/v1/agents/register", json={"node_id": node_id, "bootstrap_token": token,
                                                                 **FACTS}, timeout=10)


def heartbeat(url: str, credential: str) -> httpx.Response:
    return httpx.post(url + "/internal/v1/agents/heartbeat", json={"replicas": []},
                      headers={"Authorization": f"Bearer {credential}"}, timeout=10)


def node_row(plane: ControlPlane, node_id: str) -> Node:
    with session_scope(plane.settings) as s:
        return s.get(Node, uuid.UUID(node_id))


def test_a_register_whose_answer_is_lost_is_retried_and_gets_the_same_credential(cp: ControlPlane):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool)
    with AnswerDroppingProxy(cp.url, "/register") as proxy:
        with pytest.raises(httpx.RemoteProtocolError):
            register(proxy.url, node_id, token)
        assert proxy.dropped == [200]  # the server committed that register; its answer never arrived
        committed = node_row(cp, node_id)
        assert committed.state == NodeState.booting and committed.credential_sha256 is not None

        retried = register(proxy.url, node_id, token)
        assert retried.status_code == 200, retried.text
        credential = retried.json()["credential"]
        # The credential the lost answer carried: the digest the first attempt stored is its digest.
        assert sha256_hex(credential) == committed.credential_sha256
        assert register(proxy.url, node_id, token).json()["credential"] == credential  # any number of times

        row = node_row(cp, node_id)
        assert row.state == NodeState.booting and row.credential_sha256 == sha256_hex(credential)
        # Secrets at rest are digests only: neither the token nor the credential is stored.
        stored = {str(getattr(row, c.key)) for c in Node.__table__.columns}
        assert token not in stored and credential not in stored

        ok = heartbeat(proxy.url, credential)  # the first use of the credential spends the token
        assert ok.status_code == 200 and ok.json()["node_state"] == "booting"
        reused = register(proxy.url, node_id, token)
        assert reused.status_code == 401, reused.text
        row = node_row(cp, node_id)
        assert row.bootstrap_token_sha256 is None and row.bootstrap_salt is None and row.bootstrap_expires_at is None
        assert heartbeat(proxy.url, credential).status_code == 200  # the credential itself lives on


def test_the_retry_window_ends_with_the_grace_period(cp: ControlPlane):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool, ttl_s=600)
    first = register(cp.url, node_id, token)
    assert first.status_code == 200
    row = node_row(cp, node_id)
    # The first register starts the grace period (Settings.bootstrap_retry_grace_s, 1800 s by default).
    grace = (row.bootstrap_expires_at - utcnow()).total_seconds()
    assert abs(grace - cp.settings.bootstrap_retry_grace_s) < 60
    with session_scope(cp.settings) as s:
        s.get(Node, uuid.UUID(node_id)).bootstrap_expires_at = utcnow() - dt.timedelta(seconds=1)
    assert register(cp.url, node_id, token).status_code == 401
    assert heartbeat(cp.url, first.json()["credential"]).status_code == 200  # the credential is unaffected


def test_an_agent_whose_register_answer_is_lost_retries_and_its_node_comes_up(cp: ControlPlane, tmp_path):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool)
    with AnswerDroppingProxy(cp.url, "/register") as proxy:
        config = dataclasses.replace(agent_config(cp, node_id, token), control_plane_url=proxy.url)
        agent = AgentProcess(config, tmp_path / "node", env=FAST_AGENT_ENV).start()
        try:
            deadline = time.monotonic() + 30
            while node_row(cp, node_id).state != NodeState.ready:
                assert agent.proc.poll() is None, f"the agent exited ({agent.proc.returncode}):\n{agent.log()[-2000:]}"
                assert time.monotonic() < deadline, f"node never ready:\n{agent.log()[-2000:]}"
                time.sleep(0.2)
            assert proxy.dropped == [200]
            registers = [status for path, status in proxy.passed if path.endswith("/register")]
            assert registers == [200]  # the retry was answered, with the credential of the lost answer
            assert any(path.endswith("/heartbeat") and status == 200 for path, status in proxy.passed)
            assert node_row(cp, node_id).bootstrap_token_sha256 is None  # spent by the first authenticated call
            assert agent.proc.poll() is None
        finally:
            agent.stop()


def test_a_repeated_resume_of_the_same_agent_process_stops_nothing(cp: ControlPlane):
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool)
    answer = httpx.post(cp.url + "/internal/v1/agents/register", json={
        "node_id": node_id, "bootstrap_token": token, **FACTS, "boot_id": "boot-1"}, timeout=10).json()
    auth = {"Authorization": f"Bearer {answer['credential']}"}
    [entry] = answer["replicas"]

    def post(path: str, body: dict) -> dict:
        r = httpx.post(cp.url + f"/internal/v1/agents/{path}", json=body, headers=auth, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def replica_state() -> str:
        return cp.get_admin(f"/admin/v1/replicas?node_id={node_id}")["items"][0]["state"]

    ready = {"id": entry["id"], "state": "ready", "slot": 0, "gpu_ids": [0], "url": "http://127.0.0.1:30000"}
    post("replicas", {"replicas": [ready]})
    assert replica_state() == "ready"
    # The same agent process resumes again (an earlier resume's answer was lost, or it waited in a
    # backlog): its engine serves, so nothing is stopped.
    post("resume", {**FACTS, "boot_id": "boot-1"})
    assert replica_state() == "ready"
    # A new agent process (a restart): its old engines died with the old one.
    post("resume", {**FACTS, "boot_id": "boot-2"})
    assert replica_state() == "pending"


def test_register_is_repeatable_on_sqlite_too(tmp_path):
    """The embedded database has no row locks: the first register's salt is a compare-and-set."""
    settings = Settings(state_dir=tmp_path)
    upgrade(settings.resolved_database_url)  # migrations, 0006 included
    token, digest = new_token()
    with session_scope(settings) as s:
        node = Node(cloud="local", region="local", zone="local-a", instance_type="sim-1gpu", gpus_total=1,
                    launch_token=uuid.uuid4().hex, bootstrap_token_sha256=digest,
                    bootstrap_expires_at=utcnow() + dt.timedelta(minutes=10))
        s.add(node)
        s.flush()
        node_id = node.id
    body = agents.RegisterRequest(node_id=node_id, bootstrap_token=token)
    credentials = set()
    for _ in range(2):
        with session_scope(settings) as s:
            credential, answer = agents.register(s, body)
            credentials.add(credential)
            assert answer["node_state"] == "booting"
    assert len(credentials) == 1
    with session_scope(settings) as s:
        agents.authenticate(s, credential, spend_bootstrap=True)
    with session_scope(settings) as s, pytest.raises(Unauthorized):
        agents.register(s, body)
