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
