"""Alembic: up → down → up on Postgres and SQLite, and no drift between models and migrations."""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

import controlplane.models  # noqa: F401
from controlplane.db.base import Base
from controlplane.db.migrate import downgrade, upgrade
from tests.conftest import PG_ADMIN_DSN, _sqlalchemy_url


@pytest.fixture
def scratch_pg():
    name = f"nimbus_mig_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _sqlalchemy_url(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{name}")
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["postgres", "sqlite"])
def empty_db(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
    else:
        yield request.getfixturevalue("scratch_pg")


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_db: str) -> None:
    expected = set(Base.metadata.tables)
    upgrade(empty_db)
    assert _tables(empty_db) == expected
    downgrade(empty_db, "base")
    assert _tables(empty_db) == set()
    upgrade(empty_db)
    assert _tables(empty_db) == expected


def test_autogenerate_finds_no_difference(empty_db: str) -> None:
    upgrade(empty_db)
    engine = create_engine(empty_db)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "render_as_batch": True})
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations differ: {diff}"


def test_0004_carries_one_pool_nodes_over_to_shared_gpu_nodes(empty_db: str) -> None:
    """Rows written under the node-per-pool schema (0003) survive the move to GPU granularity."""
    from sqlalchemy import text

    upgrade(empty_db, "0003")
    ids = {k: uuid.uuid4().hex for k in ("tenant", "model", "variant", "pool", "ready", "pending", "replica",
                                         "stopped", "op")}
    now = "2026-11-30 12:00:00.000000"
    engine = create_engine(empty_db)
    with engine.begin() as conn:
        def insert(table: str, **values) -> None:
            cols = ", ".join(values)
            conn.execute(text(f"INSERT INTO {table} ({cols}) VALUES ({', '.join(':' + c for c in values)})"), values)

        uid = (lambda k: ids[k]) if empty_db.startswith("sqlite") else (lambda k: str(uuid.UUID(ids[k])))
        json_ = "{}"
        insert("tenants", id=uid("tenant"), name="t", display_name="t", status="active", weight=1.0,
               response_cache=False, created_at=now, updated_at=now)
        insert("models", id=uid("model"), name="m", display_name="m", description="", created_at=now,
               updated_at=now)
        insert("model_variants", id=uid("variant"), model_id=uid("model"), tier="bf16", model_path="p",
               engine_args=json_, gpu_count=1, gpu_memory_gb=20, context_length=8192, created_at=now, updated_at=now)
        insert("pools", id=uid("pool"), name="p", variant_id=uid("variant"), dedicated_tenant_id=uid("tenant"),
               kind="warm", min_replicas=1, max_replicas=2, desired_replicas=2, ttft_slo_ms=1000,
               placement='[{"cloud": "aws", "region": "us-east-1"}]', spot_policy="on_demand",
               spot_base_on_demand=0, idle_timeout_s=900, paused=False, autoscaler_state=json_, created_at=now,
               updated_at=now)
        for key, state, itype in (("ready", "ready", "p5.48xlarge"), ("pending", "pending", None)):
            insert("nodes", id=uid(key), pool_id=uid("pool"), state=state, cloud="aws" if itype else None,
                   region="us-east-1" if itype else None, zone="us-east-1a" if itype else None,
                   instance_type=itype, spot=False, gpus_total=8 if itype else 0, launch_token=ids[key],
                   metrics=json_, state_times=json_, created_at=now, updated_at=now)
        insert("operations", id=uid("op"), kind="launch", state="pending", pool_id=uid("pool"),
               node_id=uid("pending"), idempotency_key="launch:x", attempts=0, history="[]", created_at=now,
               updated_at=now)
        for key, state in (("replica", "ready"), ("stopped", "stopped")):
            insert("replicas", id=uid(key), node_id=uid("ready"), pool_id=uid("pool"), variant_id=uid("variant"),
                   state=state, gpu_ids="[0]", restarts=0, ready_breakdown=json_, metrics=json_, created_at=now,
                   updated_at=now)
    upgrade(empty_db)
    with engine.connect() as conn:
        nodes = {row.state: row for row in conn.execute(text(
            "SELECT state, dedicated_tenant_id, launch_spec, error FROM nodes"))}
        replicas = dict(conn.execute(text("SELECT state, desired_state FROM replicas")).all())
        op_state = conn.execute(text("SELECT state FROM operations")).scalar_one()
        cols = {c["name"] for c in inspect(conn).get_columns("nodes")}
    engine.dispose()
    assert "pool_id" not in cols
    ready = nodes["ready"]
    assert str(ready.dedicated_tenant_id).replace("-", "") == ids["tenant"]  # dedication carried from the pool
    spec = ready.launch_spec if isinstance(ready.launch_spec, dict) else __import__("json").loads(ready.launch_spec)
    assert (spec["instance_type"], spec["gpu_count"], spec["zones"]) == ("p5.48xlarge", 8, ["us-east-1a"])
    # The launch that never reached a cloud is re-planned by GPU placement.
    assert nodes["failed"].error.startswith("re-planned") and op_state == "failed"
    assert replicas == {"ready": "running", "stopped": "stopped"}
