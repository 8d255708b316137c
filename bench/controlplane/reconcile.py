"""One reconcile tick over many pools on Postgres: wall time and SQL statements, at several sizes.

    .venv/bin/python -m bench.controlplane.reconcile                 # 100 and 1,000 pools × 10 nodes
    .venv/bin/python -m bench.controlplane.reconcile --sizes 100,1000,3000 --nodes-per-pool 10 --repeat 3

Each size gets a fresh database (migrated to head), seeded with ``pools`` pools of
``nodes-per-pool`` ready nodes each. Two ticks are measured per repetition:

* ``steady``: every pool at its desired size (the common case; nothing to write but the
  reconcile timestamps);
* ``churn``: ``--churn`` of the pools want one node more and as many one node fewer
  (node rows + launch operations written, nodes drained).

A statement is one DBAPI ``execute``/``executemany`` call (SQLAlchemy's
``before_cursor_execute`` event); batched INSERTs (insertmanyvalues) count once per page.
The point to read off: statements stay flat as pools grow, time grows roughly linearly.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import psycopg
from sqlalchemy import event, insert, update

from controlplane.config import Settings
from controlplane.db.engine import session_scope, sync_sessionmaker
from controlplane.db.types import utcnow
from controlplane.fleet.provisioning import reconcile_tick
from controlplane.models import Model, ModelVariant, Node, NodeState, Pool

PG_ADMIN_DSN = os.environ.get("NIMBUS_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


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


def seed(settings: Settings, pools: int, nodes_per_pool: int, *, now: dt.datetime | None = None) -> list[uuid.UUID]:
    """``pools`` pools at their desired size, each with ``nodes_per_pool`` ready nodes. Returns pool ids."""
    now = now or utcnow()
    tag = uuid.uuid4().hex[:8]
    with session_scope(settings) as s:
        variant = ModelVariant(tier="bf16", model_path="bench/model", gpu_memory_gb=20, context_length=8192)
        s.add(Model(name=f"bench-{tag}", variants=[variant]))
        s.flush()
        pool_rows = [
            {"id": uuid.uuid4(), "name": f"b{tag}-{i}", "variant_id": variant.id, "min_replicas": 0,
             "max_replicas": 1000, "desired_replicas": nodes_per_pool,
             "placement": [{"cloud": "aws", "region": "us-east-1"}], "created_at": now, "updated_at": now}
            for i in range(pools)
        ]
        s.execute(insert(Pool), pool_rows)
        stamp = (now - dt.timedelta(minutes=10)).isoformat()
        node_rows = [
            {"id": uuid.uuid4(), "pool_id": p["id"], "state": NodeState.ready, "cloud": "aws", "region": "us-east-1",
             "zone": "us-east-1a", "instance_type": "g5.xlarge", "gpus_total": 1, "launch_token": uuid.uuid4().hex,
             "instance_id": f"i-{uuid.uuid4().hex[:17]}", "last_heartbeat_at": now,
             "state_times": {"ready": stamp}, "created_at": now - dt.timedelta(minutes=10, seconds=j),
             "updated_at": now, "metrics": {}}
            for p in pool_rows
            for j in range(nodes_per_pool)
        ]
        for start in range(0, len(node_rows), 5000):
            s.execute(insert(Node), node_rows[start : start + 5000])
        return [p["id"] for p in pool_rows]


def churn(settings: Settings, pool_ids: list[uuid.UUID], nodes_per_pool: int, fraction: float, rng: random.Random) -> None:
    """A ``fraction`` of pools want one node more, as many one node fewer; the rest are reset to size."""
    k = int(len(pool_ids) * fraction)
    chosen = rng.sample(pool_ids, min(len(pool_ids), 2 * k))
    with session_scope(settings) as s:
        s.execute(update(Pool).values(desired_replicas=nodes_per_pool))
        if chosen:
            s.execute(update(Pool).where(Pool.id.in_(chosen[:k])).values(desired_replicas=nodes_per_pool + 1))
            s.execute(update(Pool).where(Pool.id.in_(chosen[k:])).values(desired_replicas=nodes_per_pool - 1))


@contextmanager
def counting(settings: Settings) -> Iterator[list[str]]:
    engine = sync_sessionmaker(settings).kw["bind"]
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append(statement.split(None, 1)[0].upper())

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", count)


@dataclass
class TickMeasure:
    seconds: float
    statements: int
    by_verb: dict[str, int]
    pools: int
    launched: int
    removed: int


def measure_tick(settings: Settings) -> TickMeasure:
    with counting(settings) as statements:
        started = time.perf_counter()
        with session_scope(settings) as s:
            result = reconcile_tick(s, settings, utcnow())
        seconds = time.perf_counter() - started
    verbs: dict[str, int] = {}
    for verb in statements:
        verbs[verb] = verbs.get(verb, 0) + 1
    return TickMeasure(seconds, len(statements), verbs, result.pools, result.launched, result.removed)


def run_size(pools: int, nodes_per_pool: int, fraction: float, repeat: int) -> dict:
    rng = random.Random(pools)
    with fresh_database() as url:
        settings = Settings(database_url=url, reconcile_batch=max(pools, 1), drain_timeout_s=300)
        pool_ids = seed(settings, pools, nodes_per_pool)
        measure_tick(settings)  # warm-up: connection pool, statement caches
        steady, churned = [], []
        for _ in range(repeat):
            churn(settings, pool_ids, nodes_per_pool, 0.0, rng)
            measure_tick(settings)  # undoes the previous churn (not measured)
            steady.append(measure_tick(settings))
            churn(settings, pool_ids, nodes_per_pool, fraction, rng)
            churned.append(measure_tick(settings))
    return {
        "pools": pools,
        "nodes": pools * nodes_per_pool,
        "steady": summarize(steady),
        "churn": summarize(churned),
    }


def summarize(runs: list[TickMeasure]) -> dict:
    return {
        "median_seconds": round(statistics.median(r.seconds for r in runs), 4),
        "statements": sorted({r.statements for r in runs}),
        "by_verb": runs[-1].by_verb,
        "launched": runs[-1].launched,
        "removed": runs[-1].removed,
        "last": asdict(runs[-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000", help="comma-separated pool counts")
    parser.add_argument("--nodes-per-pool", type=int, default=10)
    parser.add_argument("--churn", type=float, default=0.05, help="fraction of pools growing (and shrinking) by one")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    results = [run_size(int(n), args.nodes_per_pool, args.churn, args.repeat) for n in args.sizes.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'pools':>6} {'nodes':>7} | {'steady s':>9} {'stmts':>6} | {'churn s':>8} {'stmts':>6} {'launch':>6} {'drain':>6}")
    for r in results:
        st, ch = r["steady"], r["churn"]
        print(f"{r['pools']:>6} {r['nodes']:>7} | {st['median_seconds']:>9.3f} {max(st['statements']):>6} | "
              f"{ch['median_seconds']:>8.3f} {max(ch['statements']):>6} {ch['launched']:>6} {ch['removed']:>6}")
    for r in results:
        print(f"{r['pools']} pools, churn statements by verb: {r['churn']['by_verb']}")


if __name__ == "__main__":
    main()
