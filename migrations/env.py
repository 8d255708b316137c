"""Alembic environment. The URL comes from Nimbus settings unless the caller set one."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

import controlplane.models  # noqa: F401  (registers every table)
from controlplane.config import get_settings
from controlplane.db.base import Base
from controlplane.db.engine import make_sync_engine, sync_url

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return sync_url(config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url)


def _configure(**kw) -> None:
    context.configure(
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
        render_as_batch=True,
        compare_type=True,
        **kw,
    )


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from sqlalchemy import create_engine

    url = _url()
    engine = create_engine(url, poolclass=pool.NullPool) if not url.startswith("sqlite") else None
    if engine is None:
        from controlplane.config import Settings

        engine = make_sync_engine(Settings(database_url=url))
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # Batch mode rebuilds a table by copy, drop and rename: with foreign keys enforced, the
            # drop of a table other rows reference fails. Off for the migration (a PRAGMA outside any
            # transaction, so on the raw connection), then every reference is checked.
            conn.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
        _configure(connection=conn)
        with context.begin_transaction():
            context.run_migrations()
        if sqlite:
            broken = conn.connection.driver_connection.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"migration left dangling references: {broken[:10]}")
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
