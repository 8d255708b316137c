"""The real stack for browser tests: control plane under uvicorn on Postgres, one simulator replica
and the real edge proxy pulling its snapshot from the control plane."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis as redis_sync
from pydantic import SecretStr
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from controlplane.api.app import create_app
from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.models import (
    AutoscalerDecision,
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Replica,
    ReplicaState,
)
from controlplane.services import usage_rollup
from controlplane.services.edge_snapshot import served_model_name
from dataplane.edge.process import EdgeProcess
from dataplane.sim.process import SimProcess, free_port
from tests.console.conftest import PASSWORD
from tests.controlplane.conftest import ADMIN_TOKEN, EDGE_TOKEN
from tests.controlplane.factories import create_key, create_model, create_pool, create_tenant, import_catalog
from tests.live_server import serve

SHARED_REDIS = "redis://127.0.0.1:6379/0"


@dataclass
class Stack:
    cp_url: str
    edge: EdgeProcess
    sim: SimProcess
    db_url: str
    settings: Settings
    usage_stream: str
    data: dict = field(default_factory=dict)

    def ingest_usage(self, min_events: int, timeout: float = 15.0) -> int:
        """Roll the edge's usage stream into minute buckets with the rollup service the Celery beat
        task runs (called inline here rather than through a worker)."""
        r = redis_sync.Redis.from_url(SHARED_REDIS, decode_responses=True)
        deadline = time.monotonic() + timeout
        while r.xlen(self.usage_stream) < min_events and time.monotonic() < deadline:
            time.sleep(0.1)
        result = usage_rollup.rollup(r, lambda: session_scope(self.settings), self.usage_stream)
        r.close()
        return result.counted


async def _seed_api(cp_url: str) -> dict:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=cp_url, timeout=30) as client:
        await import_catalog(client, admin)
        model = await create_model(client, admin, tiers=("bf16",))
        pool = await create_pool(client, admin, model["variants"][0]["id"], min_replicas=1, max_replicas=2)
        alice = await create_tenant(client, admin, display_name="Alice Labs", email=f"alice-{uuid.uuid4().hex[:6]}@example.com",
                                    password=PASSWORD, quota={"requests_per_minute": 600, "max_gpus": 4})
        bob = await create_tenant(client, admin, display_name="Bob Corp")
        _, bob_secret = await create_key(client, admin, bob["id"])
        private = await create_model(client, admin, tiers=("bf16",))
        await create_pool(client, admin, private["variants"][0]["id"], dedicated_tenant_id=bob["id"], min_replicas=0,
                          kind="scale_to_zero")
        return {"model": model, "pool": pool, "alice": alice, "bob": bob, "bob_secret": bob_secret,
                "private_model": private}


def _seed_fleet(db_url: str, data: dict, replica_url: str) -> None:
    """The node agent is not part of the console, so the ready node and replica it would register
    are written straight through the ORM, pointing at the real simulator."""
    now = dt.datetime.now(dt.UTC)
    pool, variant_id = data["pool"], data["model"]["variants"][0]["id"]
    engine = create_engine(db_url)
    with Session(engine) as s, s.begin():
        node = Node(pool_id=uuid.UUID(pool["id"]), state=NodeState.ready, cloud="aws", region="us-east-1",
                    zone="us-east-1a", instance_type="g6.xlarge", gpus_total=1, launch_token=uuid.uuid4().hex,
                    instance_id="i-0sim0console", last_heartbeat_at=now)
        s.add(node)
        s.flush()
        s.add(Replica(node_id=node.id, pool_id=node.pool_id, variant_id=uuid.UUID(variant_id), state=ReplicaState.ready,
                      url=replica_url, gpu_ids=[0], max_running_requests=32, max_total_tokens=200_000,
                      started_at=now, ready_at=now, model_ready_seconds=41.5,
                      ready_breakdown={"download": 20.0, "load": 17.5, "warmup": 4.0}, last_heartbeat_at=now,
                      metrics={"token_usage": 0.25, "num_running_reqs": 0, "num_queue_reqs": 0, "cache_hit_rate": 0.5}))
        s.add(AutoscalerDecision(pool_id=node.pool_id, current_replicas=1, target_replicas=2, action="scale_up",
                                 reasons=["queue delay p90 1.8 s above the 1.0 s TTFT SLO for 30 s"],
                                 signals={"rps": 4.2, "queue_ms_p90": 1800}))
        s.add(Operation(kind=OperationKind.launch, state=OperationState.succeeded, pool_id=node.pool_id,
                        node_id=node.id, idempotency_key=uuid.uuid4().hex, attempts=2, finished_at=now, history=[
                            {"at": now.isoformat(), "cloud": "aws", "region": "us-east-1", "zone": "us-east-1b",
                             "instance_type": "g6.xlarge", "spot": False,
                             "error": "InsufficientInstanceCapacity", "scope": "zone"},
                            {"at": now.isoformat(), "cloud": "aws", "region": "us-east-1", "zone": "us-east-1a",
                             "instance_type": "g6.xlarge", "spot": False, "error": None},
                        ]))
    engine.dispose()


@contextmanager
def running_stack(db_url: str, workdir: Path) -> Iterator[Stack]:
    edge_port = free_port()
    settings = Settings(database_url=db_url, admin_token=SecretStr(ADMIN_TOKEN), edge_token=SecretStr(EDGE_TOKEN),
                        state_dir=workdir / "state", edge_url=f"http://127.0.0.1:{edge_port}", key_cache_seconds=1.0)
    stream = f"test:console:usage:{uuid.uuid4().hex}"
    with serve(create_app(settings)) as cp_url:
        data = asyncio.run(_seed_api(cp_url))
        sim = SimProcess(served_model_name=served_model_name(data["model"]["name"], "bf16"),
                         log_path=workdir / "sim.log").start()
        edge = EdgeProcess(None, control_plane_url=cp_url, port=edge_port, state_dir=workdir / "edge",
                           env={"NIMBUS_EDGE_TOKEN": EDGE_TOKEN}, redis_url=SHARED_REDIS,
                           settings={"usage_stream": stream, "redis_key_prefix": f"test:{uuid.uuid4().hex}:",
                                     "snapshot_poll_s": 0.3},
                           log_path=workdir / "edge.log")
        try:
            _seed_fleet(db_url, data, sim.url)
            edge.start()
            yield Stack(cp_url=cp_url, edge=edge, sim=sim, db_url=db_url, settings=settings, usage_stream=stream,
                        data=data)
        finally:
            edge.close()
            sim.stop()
            redis_sync.Redis.from_url(SHARED_REDIS).delete(stream)
