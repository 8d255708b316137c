"""One fleet tick (``controlplane.fleet.reconcile.fleet_tick``) on Postgres: wall time and SQL statements, at
several fleet sizes.

    .venv/bin/python -m bench.controlplane.reconcile                 # 100 and 1,000 pools × 10 replicas
    .venv/bin/python -m bench.controlplane.reconcile --sizes 100,1000,3000 --replicas-per-pool 10 --repeat 3

Each size gets a fresh database (migrated to head) with a one-region catalog (one 8-GPU shape,
on-demand), seeded with ``pools`` pools of ``--replicas-per-pool`` ready 1-GPU replicas each.
The replicas share ready ``--gpus-per-node``-GPU nodes, dealt round robin, so every node hosts
replicas of several pools (the last node may be partly free). Two ticks are measured per
repetition, each from the seeded state (the database is put back between ticks, unmeasured):

* ``steady``: every pool at its desired size (the common case; nothing to write but the
  reconcile timestamps);
* ``churn``: ``--churn`` of the pools want one replica more and as many one replica fewer
  (replica rows placed into free GPU slots or onto new nodes, whose rows and launch operations
  are written; surplus replicas told to stop; nodes stay).

A statement is one DBAPI ``execute``/``executemany`` call (SQLAlchemy's
``before_cursor_execute`` event); batched INSERTs (insertmanyvalues) count once per page.
Besides wall time, each tick reports the CPU time of this process (``process_time``: the
tick's Python side, less sensitive than wall time to other work on a shared machine) and the
ORM objects it loads (``orm``: the session's ``loaded_as_persistent`` events; the tick reads the
fleet as plain rows, so a steady tick loads only the catalog's few rows).
The point to read off: statements stay flat as pools and nodes grow, churn included (new nodes,
replicas and launch operations are written in batches); time grows with the fleet, about
linearly, since every tick reads every live node and replica.

Before/after comparisons of two source trees, alternating runs: ``bench.controlplane.reconcile_compare``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import psycopg
from sqlalchemy import delete, event, insert, update

from controlplane.config import Settings
from controlplane.db.engine import session_scope, sync_sessionmaker
from controlplane.db.types import utcnow
from controlplane.fleet.reconcile import fleet_tick
from controlplane.models import (
    AuditEvent,
    AutoscalerDecision,
    Model,
    ModelVariant,
    Node,
    NodeState,
    Operation,
    Pool,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)
from controlplane.services.catalog import import_catalog

PG_ADMIN_DSN = os.environ.get("NIMBUS_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REGION = "us-east-1"
SHAPE = {"name": "p5.48xlarge", "gpu_type": "h100", "gpu_count": 8, "gpu_memory_gb": 80,
         "on_demand_price": 55.04, "spot_price": None}


def bench_catalog(gpus_per_node: int = 8) -> dict:
    shape = {**SHAPE, "gpu_count": gpus_per_node, "on_demand_price": round(6.88 * gpus_per_node, 2)}
    return {"version": 1, "generated_by": "bench", "clouds": [{"name": "aws", "regions": [{
        "name": REGION, "template": {"kind": "aws_launch_template", "id": "lt-bench"},
        "zones": [{"name": f"{REGION}a"}, {"name": f"{REGION}b"}], "instance_types": [shape]}]}]}


@contextmanager
def fresh_database() -> Iterator[str]:
    name = f"nimbus_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN_DSN.replace("postgresql://", "postgresql+psycopg://", 1).rsplit("/", 1)[0] + f"/{name}"
    try:
        from controlplane.db.migrate import upgrade

        upgrade(url)
        yield url
    finally:
        sync_sessionmaker(Settings(database_url=url)).kw["bind"].dispose()
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@dataclass(frozen=True)
class Seeded:
    pool_ids: list[uuid.UUID]
    node_ids: list[uuid.UUID]
    replicas_per_pool: int
    at: dt.datetime  # every seeded row was created before this


def seed(settings: Settings, pools: int, replicas_per_pool: int, *, gpus_per_node: int = 8,
         now: dt.datetime | None = None, catalog: bool = True) -> Seeded:
    """``pools`` pools at their desired size, each with ``replicas_per_pool`` ready 1-GPU replicas
    dealt round robin onto shared ready nodes of ``gpus_per_node`` GPUs. Imports the bench catalog
    (once per database) unless ``catalog`` is False."""
    now = now or utcnow()
    tag = uuid.uuid4().hex[:8]
    born = now - dt.timedelta(minutes=10)
    with session_scope(settings) as s:
        if catalog:
            import_catalog(s, bench_catalog(gpus_per_node))
        variant = ModelVariant(tier="bf16", model_path="bench/model", gpu_memory_gb=20, gpu_count=1,
                               context_length=8192)
        s.add(Model(name=f"bench-{tag}", variants=[variant]))
        s.flush()
        pool_rows = [
            {"id": uuid.uuid4(), "name": f"b{tag}-{i}", "variant_id": variant.id, "min_replicas": 0,
             "max_replicas": 1000, "desired_replicas": replicas_per_pool,
             "placement": [{"cloud": "aws", "region": REGION}], "created_at": born, "updated_at": born}
            for i in range(pools)
        ]
        if pool_rows:
            s.execute(insert(Pool), pool_rows)
        # Round robin: replica k of every pool before replica k+1 of any, so a node hosts many pools.
        slots = [p["id"] for k in range(replicas_per_pool) for p in pool_rows]
        spec = {"cloud": "aws", "region": REGION, "instance_type": SHAPE["name"], "gpu_type": SHAPE["gpu_type"],
                "gpu_count": gpus_per_node, "gpu_memory_gb": SHAPE["gpu_memory_gb"], "spot": False,
                "price_per_hour": round(6.88 * gpus_per_node, 2), "zones": [f"{REGION}a"], "reason": "bench"}
        node_rows, replica_rows = [], []
        for n in range(math.ceil(len(slots) / gpus_per_node)):
            node_id = uuid.uuid4()
            node_rows.append({
                "id": node_id, "state": NodeState.ready, "cloud": "aws", "region": REGION, "zone": f"{REGION}a",
                "instance_type": SHAPE["name"], "gpus_total": gpus_per_node, "spot": False, "launch_spec": spec,
                "launch_token": uuid.uuid4().hex, "instance_id": f"i-{uuid.uuid4().hex[:17]}",
                "agent_url": f"http://10.0.{n // 250}.{n % 250}:8081", "last_heartbeat_at": now,
                "state_times": {"ready": born.isoformat()}, "created_at": born - dt.timedelta(seconds=n),
                "updated_at": born, "metrics": {}})
            for gpu, pool_id in enumerate(slots[n * gpus_per_node:(n + 1) * gpus_per_node]):
                replica_rows.append({
                    "id": uuid.uuid4(), "node_id": node_id, "pool_id": pool_id, "variant_id": variant.id,
                    "state": ReplicaState.ready, "desired_state": ReplicaDesiredState.running, "gpu_ids": [gpu],
                    "url": f"http://10.0.{n // 250}.{n % 250}:{30000 + gpu}", "port": 30000 + gpu,
                    "model_ready_seconds": 60.0, "created_at": born, "updated_at": born, "metrics": {},
                    "ready_breakdown": {}, "restarts": 0})
        for rows, model in ((node_rows, Node), (replica_rows, Replica)):
            for start in range(0, len(rows), 5000):
                s.execute(insert(model), rows[start:start + 5000])
    return Seeded([p["id"] for p in pool_rows], [n["id"] for n in node_rows], replicas_per_pool, now)


def reset(settings: Settings, seeded: Seeded) -> None:
    """Back to the seeded fleet: what ticks added is deleted, what they changed is put back."""
    with session_scope(settings) as s:
        s.execute(delete(Operation))
        s.execute(delete(AuditEvent).where(AuditEvent.target_type == "nodes"))
        s.execute(delete(AutoscalerDecision))
        s.execute(delete(Replica).where(Replica.created_at >= seeded.at))
        s.execute(delete(Node).where(Node.created_at >= seeded.at))
        s.execute(update(Replica).values(state=ReplicaState.ready, desired_state=ReplicaDesiredState.running,
                                         drain_deadline_at=None, stop_reason=None, metrics={}, spare=False))
        s.execute(update(Node).values(state=NodeState.ready, empty_since=None, underused_since=None,
                                      drain_deadline_at=None, metrics={}))
        s.execute(update(Pool).values(desired_replicas=seeded.replicas_per_pool, capacity_status=None))


def churn(settings: Settings, seeded: Seeded, fraction: float, rng: random.Random) -> tuple[int, int]:
    """A ``fraction`` of pools want one replica more, as many one replica fewer; the rest stay at
    size. Returns (pools growing, pools shrinking)."""
    k = int(len(seeded.pool_ids) * fraction)
    chosen = rng.sample(seeded.pool_ids, min(len(seeded.pool_ids), 2 * k))
    n = seeded.replicas_per_pool
    with session_scope(settings) as s:
        s.execute(update(Pool).values(desired_replicas=n))
        if chosen:
            s.execute(update(Pool).where(Pool.id.in_(chosen[:k])).values(desired_replicas=n + 1))
            s.execute(update(Pool).where(Pool.id.in_(chosen[k:])).values(desired_replicas=max(0, n - 1)))
    return len(chosen[:k]), len(chosen[k:])


@contextmanager
def counting(settings: Settings) -> Iterator[list[str]]:
    """Every statement the engine sends while open (SQL text, for the verb and for diagnosis)."""
    engine = sync_sessionmaker(settings).kw["bind"]
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", count)


@dataclass
class TickMeasure:
    seconds: float
    cpu_seconds: float
    orm_objects: int  # ORM objects the tick loaded (the session's loaded_as_persistent events)
    statements: int
    by_verb: dict[str, int]
    pools: int
    placed: int
    launched: int
    stopped: int
    terminated: int
    moves: int
    skipped: bool
    demoted: int = 0  # surplus replicas kept as spares (fleet.spares) instead of stopped
    evicted: int = 0  # spares stopped for the replicas placed on their GPUs


def verb(statement: str) -> str:
    return statement.split(None, 1)[0].upper()


def measure_tick(settings: Settings, now: dt.datetime | None = None) -> TickMeasure:
    with counting(settings) as statements:
        started, cpu = time.perf_counter(), time.process_time()
        with session_scope(settings) as s:
            loaded = [0]

            def count_loaded(session, instance) -> None:
                loaded[0] += 1

            event.listen(s, "loaded_as_persistent", count_loaded)
            result = fleet_tick(s, settings, now or utcnow())
            orm_objects = loaded[0]
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    verbs: dict[str, int] = {}
    for statement in statements:
        verbs[verb(statement)] = verbs.get(verb(statement), 0) + 1
    return TickMeasure(seconds, cpu, orm_objects, len(statements), verbs, result.pools, result.placed, result.launched, result.stopped,
                       result.terminated, result.moves, result.skipped, result.demoted, result.evicted)


def run_size(pools: int, replicas_per_pool: int, gpus_per_node: int, fraction: float, repeat: int) -> dict:
    rng = random.Random(pools)
    with fresh_database() as url:
        settings = Settings(database_url=url, drain_timeout_s=300)
        seeded = seed(settings, pools, replicas_per_pool, gpus_per_node=gpus_per_node)
        measure_tick(settings)  # warm-up: connection pool, statement caches
        steady, churned = [], []
        for _ in range(repeat):
            reset(settings, seeded)
            steady.append(measure_tick(settings))
            reset(settings, seeded)
            churn(settings, seeded, fraction, rng)
            churned.append(measure_tick(settings))
        reset(settings, seeded)
    return {
        "pools": pools,
        "nodes": len(seeded.node_ids),
        "replicas": pools * replicas_per_pool,
        "steady": summarize(steady),
        "churn": summarize(churned),
    }


def summarize(runs: list[TickMeasure]) -> dict:
    last = runs[-1]
    return {
        "median_seconds": round(statistics.median(r.seconds for r in runs), 4),
        "min_seconds": round(min(r.seconds for r in runs), 4),
        "median_cpu_seconds": round(statistics.median(r.cpu_seconds for r in runs), 4),
        "orm_objects": max(r.orm_objects for r in runs),
        "statements": sorted({r.statements for r in runs}),
        "by_verb": last.by_verb,
        "placed": last.placed,
        "launched": last.launched,
        "stopped": last.stopped,
        "last": asdict(last),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000", help="comma-separated pool counts")
    parser.add_argument("--replicas-per-pool", type=int, default=10)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--churn", type=float, default=0.05, help="fraction of pools growing (and shrinking) by one")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    results = [run_size(int(n), args.replicas_per_pool, args.gpus_per_node, args.churn, args.repeat)
               for n in args.sizes.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'pools':>6} {'nodes':>6} {'replicas':>8} | {'steady s':>9} {'cpu s':>6} {'stmts':>6} {'orm':>5} | "
          f"{'churn s':>8} {'cpu s':>6} {'stmts':>6} {'placed':>6} {'launch':>6} {'stop':>5}")
    for r in results:
        st, ch = r["steady"], r["churn"]
        print(f"{r['pools']:>6} {r['nodes']:>6} {r['replicas']:>8} | {st['median_seconds']:>9.3f} "
              f"{st['median_cpu_seconds']:>6.3f} {max(st['statements']):>6} {st['orm_objects']:>5} | "
              f"{ch['median_seconds']:>8.3f} {ch['median_cpu_seconds']:>6.3f} {max(ch['statements']):>6} "
              f"{ch['placed']:>6} {ch['launched']:>6} {ch['stopped']:>5}")
    for r in results:
        print(f"{r['pools']} pools, churn statements by verb: {r['churn']['by_verb']}")


if __name__ == "__main__":
    main()
