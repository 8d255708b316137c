"""Seeding fleet rows for console tests. Nodes and replicas are made by the fleet loop and the node
agents, not by an admin API, so the tests write the rows those would write straight through the ORM.

The fleet seeded by ``seed_fleet_rows`` (prices from tests.controlplane.factories.CATALOG):

- ``sim_node``: aws/us-east-1a g6.xlarge, on-demand, 1 GPU, no launch spec (priced from the catalog,
  0.80 $/h); GPU 0 holds the main pool's ready replica on the real simulator. Its last consolidation
  record says it is being emptied (delete) by moving that replica onto ``shared_node``.
- ``shared_node``: aws/us-east-1b p5.48xlarge, on-demand, 8 GPUs, launch spec price 96.00 $/h
  (12.00 per GPU-hour; the launch spec's price wins over the catalog's 98.30). GPUs 0-1: main pool,
  starting; 2-3: batch pool, ready; 4: batch pool, told to stop (draining); 5: the main pool's
  consolidation copy of the simulator replica, starting; 6-7 free.
- ``dedicated_node``: Bob's, pending (not launched yet), g6.xlarge spot, 1 GPU, launch spec 0.30 $/h; empty.
- ``gone_node``: terminated p5.48xlarge with a stopped replica: neither billed nor allocated.

Only the simulator replica has a URL, so the edge never routes to the others.

Fleet totals: billed 10 GPUs, allocated 7, 3 free (30%), 97.10 $/h; by pool: main 36.80
(0.80 + 3 × 12.00), batch 36.00 (3 × 12.00), unallocated 24.30 (2 × 12.00 + 0.30).
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from controlplane.models import (
    AutoscalerDecision,
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)

EXPECTED = {"billed": "10", "allocated": "7", "free": "3 (30%)", "cost": "$97.10", "main": "$36.80",
            "batch": "$36.00", "unallocated": "$24.30"}


def _node(**kw) -> Node:
    return Node(launch_token=uuid.uuid4().hex, **kw)


def seed_fleet_rows(db_url: str, data: dict, replica_url: str) -> dict:
    """Write the fleet described above; returns the ids of its rows (strings) by name."""
    now = dt.datetime.now(dt.UTC)
    main, batch = uuid.UUID(data["pool"]["id"]), uuid.UUID(data["batch_pool"]["id"])
    main_variant = uuid.UUID(data["model"]["variants"][0]["id"])
    batch_variant = uuid.UUID(data["batch_model"]["variants"][0]["id"])
    ids: dict[str, str] = {}
    engine = create_engine(db_url)
    with Session(engine) as s, s.begin():
        sim_node = _node(state=NodeState.ready, cloud="aws", region="us-east-1", zone="us-east-1a",
                         instance_type="g6.xlarge", gpus_total=1, instance_id="i-0sim0console", last_heartbeat_at=now,
                         state_times={"pending": (now - dt.timedelta(minutes=30)).isoformat(),
                                      "ready": (now - dt.timedelta(minutes=25)).isoformat()},
                         underused_since=now - dt.timedelta(minutes=10))
        shared_node = _node(state=NodeState.ready, cloud="aws", region="us-east-1", zone="us-east-1b",
                            instance_type="p5.48xlarge", gpus_total=8, instance_id="i-0shared8gpu",
                            last_heartbeat_at=now, cached_models=["org/batch-model", "org/main-model"], launch_spec={
                                "cloud": "aws", "region": "us-east-1", "instance_type": "p5.48xlarge",
                                "gpu_type": "h100", "gpu_count": 8, "spot": False, "price_per_hour": 96.0,
                                "zones": ["us-east-1b", "us-east-1a"]})
        dedicated_node = _node(state=NodeState.pending, dedicated_tenant_id=uuid.UUID(data["bob"]["id"]), spot=True,
                               gpus_total=1, empty_since=now, launch_spec={
                                   "cloud": "aws", "region": "us-east-1", "instance_type": "g6.xlarge",
                                   "gpu_type": "l4", "gpu_count": 1, "spot": True, "price_per_hour": 0.3,
                                   "zones": ["us-east-1a"]})
        gone_node = _node(state=NodeState.terminated, cloud="aws", region="us-east-1", zone="us-east-1a",
                          instance_type="p5.48xlarge", gpus_total=8, launch_spec={"price_per_hour": 98.3})
        s.add_all([sim_node, shared_node, dedicated_node, gone_node])
        s.flush()

        sim_replica = Replica(
            node_id=sim_node.id, pool_id=main, variant_id=main_variant, state=ReplicaState.ready, url=replica_url,
            gpu_ids=[0], max_running_requests=32, max_total_tokens=200_000, started_at=now, ready_at=now,
            model_ready_seconds=41.5, ready_breakdown={"download": 20.0, "load": 17.5, "warmup": 4.0},
            last_heartbeat_at=now,
            metrics={"token_usage": 0.25, "num_running_reqs": 0, "num_queue_reqs": 0, "cache_hit_rate": 0.5})
        s.add(sim_replica)
        s.flush()
        on_shared = {
            "main_starting": Replica(node_id=shared_node.id, pool_id=main, variant_id=main_variant,
                                     state=ReplicaState.starting, gpu_ids=[0, 1], started_at=now),
            "batch_ready": Replica(node_id=shared_node.id, pool_id=batch, variant_id=batch_variant,
                                   state=ReplicaState.ready, gpu_ids=[2, 3], started_at=now, ready_at=now),
            "batch_stopping": Replica(node_id=shared_node.id, pool_id=batch, variant_id=batch_variant,
                                      state=ReplicaState.ready, desired_state=ReplicaDesiredState.stopped,
                                      gpu_ids=[4], started_at=now, ready_at=now,
                                      drain_deadline_at=now + dt.timedelta(minutes=5)),
            "main_copy": Replica(node_id=shared_node.id, pool_id=main, variant_id=main_variant,
                                 state=ReplicaState.starting, gpu_ids=[5], replaces_id=sim_replica.id, started_at=now),
        }
        s.add_all(on_shared.values())
        s.add(Replica(node_id=gone_node.id, pool_id=batch, variant_id=batch_variant, state=ReplicaState.stopped,
                      desired_state=ReplicaDesiredState.stopped, gpu_ids=[0, 1, 2, 3]))
        sim_node.metrics = {"consolidation": {
            "at": now.isoformat(), "kind": "delete", "moves": 1, "score": 4.2, "savings_per_hour": 0.8,
            "disruption_cost": 0.1419,
            "reason": "g6.xlarge uses 1 of 1 GPUs; its replica fits in free slots of p5.48xlarge; saves $0.80/h"}}

        s.add(AutoscalerDecision(pool_id=main, current_replicas=1, target_replicas=2, action="scale_up",
                                 reasons=["queue delay p90 1.8 s above the 1.0 s TTFT SLO for 30 s"],
                                 signals={"rps": 4.2, "queue_ms_p90": 1800}))
        s.add(Operation(kind=OperationKind.launch, state=OperationState.succeeded, pool_id=main,
                        node_id=sim_node.id, idempotency_key=uuid.uuid4().hex, attempts=2, finished_at=now, history=[
                            {"at": now.isoformat(), "cloud": "aws", "region": "us-east-1", "zone": "us-east-1b",
                             "instance_type": "g6.xlarge", "spot": False,
                             "error": "InsufficientInstanceCapacity", "scope": "zone"},
                            {"at": now.isoformat(), "cloud": "aws", "region": "us-east-1", "zone": "us-east-1a",
                             "instance_type": "g6.xlarge", "spot": False, "error": None},
                        ]))
        s.flush()
        ids.update(sim_node=str(sim_node.id), shared_node=str(shared_node.id), dedicated_node=str(dedicated_node.id),
                   gone_node=str(gone_node.id), sim_replica=str(sim_replica.id),
                   **{name: str(r.id) for name, r in on_shared.items()})
    engine.dispose()
    return ids
