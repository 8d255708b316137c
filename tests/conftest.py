"""Fixtures shared by every test package: a fresh Postgres database per test session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, text

PG_ADMIN_DSN = os.environ.get("NIMBUS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def _sqlalchemy_url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A brand-new Postgres database for this test session, migrated to head; dropped afterwards."""
    name = f"nimbus_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _sqlalchemy_url(PG_ADMIN_DSN.rsplit("/", 1)[0] + f"/{name}")
    from controlplane.db.migrate import upgrade

    upgrade(url)
    yield url
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def truncate_all(url: str) -> None:
    import controlplane.models  # noqa: F401
    from controlplane.db.base import Base

    engine = create_engine(url)
    with engine.begin() as conn:
        tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {tables} CASCADE"))
    engine.dispose()


@pytest.fixture
def db_url(pg_database: str) -> Iterator[str]:
    """The session database, emptied after each test so no state leaks between tests."""
    yield pg_database
    truncate_all(pg_database)
