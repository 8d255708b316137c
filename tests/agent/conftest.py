"""A real control plane (Postgres, uvicorn on a free port) with a pool of the ``local`` cloud, and
node rows made the way the fleet makes them (a bootstrap token, hashed), with the replica rows
placement writes for them (desired ``running``, state ``pending``, explicit GPU indices)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx
import pytest
from pydantic import SecretStr

from controlplane.api.app import create_app
from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.embedded import LOCAL_CATALOG
from controlplane.fleet.nodes import transition
from controlplane.models import Node, NodeState, Replica, ReplicaDesiredState, ReplicaState
from controlplane.services.secrets import new_token
from infra.bootstrap import AgentConfig
from tests.live_server import serve

ADMIN_TOKEN = "agent-tests-admin-token-0123456789"
EDGE_TOKEN = "agent-tests-edge-token-0123456789"
# The simulator runs 20× faster than real time and loads in 0.2 s: tests stay short.
FAST_AGENT_ENV = {
    "NIMBUS_AGENT_HEARTBEAT_S": "0.5",
    "NIMBUS_AGENT_DRAIN_GRACE_S": "1",
    "NIMBUS_AGENT_BACKOFF_BASE_S": "0.2",
    "NIMBUS_AGENT_SIM_ARGS": "--time-scale 20 --ready-delay 0.2",
}


@dataclass
class ControlPlane:
    url: str
    settings: Settings
    http: httpx.Client

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def post(self, path: str, body: dict | None = None, **kw) -> httpx.Response:
        return self.http.post(self.url + path, json=body, **kw)

    def get_admin(self, path: str) -> dict:
        r = self.http.get(self.url + path, headers=self.admin)
        assert r.status_code == 200, r.text
        return r.json()


@dataclass
class Pool:
    id: str
    variant_id: str
    served_model_name: str


@pytest.fixture
def cp(db_url: str, tmp_path) -> Iterator[ControlPlane]:
    settings = Settings(database_url=db_url, admin_token=SecretStr(ADMIN_TOKEN), edge_token=SecretStr(EDGE_TOKEN),
                        state_dir=tmp_path / "cp-state")
    with serve(create_app(settings)) as url, httpx.Client(timeout=10) as http:
        yield ControlPlane(url, settings, http)


def make_pool(cp: ControlPlane, tiers=("bf16",), engine_args: dict | None = None) -> Pool:
    r = cp.post("/admin/v1/catalog/import", LOCAL_CATALOG, headers=cp.admin)
    assert r.status_code == 200, r.text
    name = f"tiny-{uuid.uuid4().hex[:6]}"
    variants = [{"tier": t, "model_path": f"Qwen/Qwen2.5-0.5B-Instruct{'-FP8' if t == 'fp8' else ''}",
                 "gpu_memory_gb": 8, "context_length": 4096, "quantization": "fp8" if t == "fp8" else None,
                 "engine_args": engine_args or {}} for t in tiers]
    r = cp.post("/admin/v1/models", {"name": name, "variants": variants}, headers=cp.admin)
    assert r.status_code == 201, r.text
    variant = r.json()["variants"][0]
    r = cp.post("/admin/v1/pools", {"name": f"pool-{uuid.uuid4().hex[:6]}", "variant_id": variant["id"],
                                    "placement": [{"cloud": "local", "region": "local"}],
                                    "min_replicas": 0, "max_replicas": 4}, headers=cp.admin)
    assert r.status_code == 201, r.text
    return Pool(r.json()["id"], variant["id"], f"{name}-{variant['tier']}")


def make_node(cp: ControlPlane, pool: Pool, *, gpus: int = 1, replicas: Sequence[Sequence[int]] | None = None,
              ttl_s: float = 600, state: NodeState = NodeState.booting) -> tuple[str, str]:
    """A node row as the fleet leaves it after launch, with one replica of ``pool`` per GPU (or
    one per GPU list in ``replicas``): (node id, one-time bootstrap token)."""
    token, digest = new_token()
    with session_scope(cp.settings) as s:
        node = Node(cloud="local", region="local", zone="local-a",
                    instance_type=f"sim-{gpus}gpu" if gpus in (1, 2, 4, 8) else "sim-8gpu", gpus_total=gpus,
                    launch_token=uuid.uuid4().hex, bootstrap_token_sha256=digest,
                    bootstrap_expires_at=utcnow() + dt.timedelta(seconds=ttl_s))
        s.add(node)
        s.flush()
        for step in (NodeState.provisioning, NodeState.booting):
            if node.state != state:
                transition(s, node, step, reason="test")
        for gpu_ids in [[g] for g in range(gpus)] if replicas is None else replicas:
            add_replica(s, str(node.id), pool, gpu_ids)
        return str(node.id), token


def add_replica(session, node_id: str, pool: Pool, gpu_ids: Sequence[int]) -> str:
    """A replica row as placement writes it: desired running, pending until its agent reports."""
    replica = Replica(id=uuid.uuid4(), node_id=uuid.UUID(node_id), pool_id=uuid.UUID(pool.id),
                      variant_id=uuid.UUID(pool.variant_id), desired_state=ReplicaDesiredState.running,
                      state=ReplicaState.pending, gpu_ids=sorted(gpu_ids), metrics={}, ready_breakdown={}, restarts=0)
    session.add(replica)
    session.flush()
    return str(replica.id)


def agent_config(cp: ControlPlane, node_id: str, token: str, **extra) -> AgentConfig:
    return AgentConfig(control_plane_url=cp.url, node_id=node_id, bootstrap_token=token,
                       bootstrap_token_expires_at=utcnow() + dt.timedelta(minutes=10), variant="tiny:bf16",
                       engine="sim", cloud="local", region="local", zone="local-a", **extra)
