"""The real stack for browser tests: control plane under uvicorn on Postgres, one simulator replica
and the real edge proxy pulling its snapshot from the control plane. The fleet rows (nodes sharing
GPUs between pools) are seeded by tests.console.fleet_rows."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis as redis_sync
from pydantic import SecretStr

from controlplane.api.app import create_app
from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.services import usage_rollup
from controlplane.services.edge_snapshot import served_model_name
from dataplane.edge.process import EdgeProcess
from dataplane.sim.process import SimProcess, free_port
from tests.console.conftest import PASSWORD
from tests.console.fleet_rows import seed_fleet_rows
from tests.controlplane.conftest import ADMIN_TOKEN, EDGE_TOKEN, isolated_throttle
from tests.controlplane.factories import create_key, create_model, create_pool, create_tenant, import_catalog
from tests.live_server import serve
from tests.usage_events import stream_events

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
        while len(stream_events(r, self.usage_stream)) < min_events and time.monotonic() < deadline:
            time.sleep(0.1)
        result = usage_rollup.rollup(r, lambda: session_scope(self.settings), self.usage_stream)
        r.close()
        return result.counted


async def _seed_api(cp_url: str) -> dict:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=cp_url, timeout=30) as client:
        await import_catalog(client, admin)
        model = await create_model(client, admin, tiers=("bf16",))
        pool = await create_pool(client, admin, model["variants"][0]["id"], min_replicas=1, max_replicas=2,
                                 schedule=[{"days": ["mon", "tue", "wed", "thu", "fri"], "start": "09:00",
                                            "end": "18:00", "min_replicas": 2}], schedule_timezone="Europe/Berlin")
        alice = await create_tenant(client, admin, display_name="Alice Labs", email=f"alice-{uuid.uuid4().hex[:6]}@example.com",
                                    password=PASSWORD, quota={"requests_per_minute": 600, "max_gpus": 4})
        bob = await create_tenant(client, admin, display_name="Bob Corp")
        _, bob_secret = await create_key(client, admin, bob["id"])
        private = await create_model(client, admin, tiers=("bf16",))
        await create_pool(client, admin, private["variants"][0]["id"], dedicated_tenant_id=bob["id"], min_replicas=0,
                          kind="scale_to_zero")
        # A second shared pool, so that two pools share a node in the fleet views. Its model's name sorts
        # after the main model's, which stays the playground's first choice.
        r = await client.post("/admin/v1/models", headers=admin, json={
            "name": f"zeta-batch-{uuid.uuid4().hex[:6]}", "variants": [
                {"tier": "bf16", "model_path": "meta-llama/Llama-3.1-8B-Instruct", "gpu_memory_gb": 20,
                 "context_length": 8192}]})
        assert r.status_code == 201, r.text
        batch_model = r.json()
        batch_pool = await create_pool(client, admin, batch_model["variants"][0]["id"])
        return {"model": model, "pool": pool, "alice": alice, "bob": bob, "bob_secret": bob_secret,
                "private_model": private, "batch_model": batch_model, "batch_pool": batch_pool}


@contextmanager
def running_stack(db_url: str, workdir: Path) -> Iterator[Stack]:
    edge_port = free_port()
    settings = Settings(database_url=db_url, admin_token=SecretStr(ADMIN_TOKEN), edge_token=SecretStr(EDGE_TOKEN),
                        state_dir=workdir / "state", edge_url=f"http://127.0.0.1:{edge_port}", key_cache_seconds=1.0,
                        signin_throttle=isolated_throttle())
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
            data["fleet"] = seed_fleet_rows(db_url, data, sim.url)
            edge.start()
            yield Stack(cp_url=cp_url, edge=edge, sim=sim, db_url=db_url, settings=settings, usage_stream=stream,
                        data=data)
        finally:
            edge.close()
            sim.stop()
            redis_sync.Redis.from_url(SHARED_REDIS).delete(stream)
