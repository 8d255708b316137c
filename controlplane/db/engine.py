"""Engines and sessions: async for the API, sync for Celery tasks and the CLI; one URL for both."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from controlplane.config import Settings, get_settings


def sync_url(url: str) -> str:
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres", "postgresql+asyncpg"):
        u = u.set(drivername="postgresql+psycopg")
    elif u.drivername == "sqlite+aiosqlite":
        u = u.set(drivername="sqlite")
    return u.render_as_string(hide_password=False)


def async_url(url: str) -> str:
    u = make_url(sync_url(url))
    if u.drivername == "sqlite":
        u = u.set(drivername="sqlite+aiosqlite")
    return u.render_as_string(hide_password=False)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # Foreign keys are off by default in SQLite; WAL lets the API read while a worker writes.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()


def _engine_kwargs(settings: Settings) -> dict:
    if settings.is_sqlite:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        return {"echo": settings.sql_echo}
    return {
        "echo": settings.sql_echo,
        "pool_size": settings.db_pool_size,
        "max_overflow": settings.db_pool_size,
        # Optimistic disconnect handling instead of pre-ping (which adds a round trip to every
        # checkout and cut throughput by a third): a dropped connection fails one request and
        # SQLAlchemy invalidates the pool; recycling keeps connections younger than proxies' limits.
        "pool_recycle": 1800,
    }


def make_sync_engine(settings: Settings) -> Engine:
    engine = create_engine(sync_url(settings.resolved_database_url), **_engine_kwargs(settings))
    if settings.is_sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def make_async_engine(settings: Settings) -> AsyncEngine:
    engine = create_async_engine(async_url(settings.resolved_database_url), **_engine_kwargs(settings))
    if settings.is_sqlite:
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


_sync_makers: dict[str, sessionmaker[Session]] = {}


def sync_sessionmaker(settings: Settings | None = None) -> sessionmaker[Session]:
    """One engine (connection pool) per database URL per process."""
    settings = settings or get_settings()
    url = settings.resolved_database_url
    if url not in _sync_makers:
        _sync_makers[url] = sessionmaker(make_sync_engine(settings), expire_on_commit=False)
    return _sync_makers[url]


@contextmanager
def session_scope(settings: Settings | None = None) -> Iterator[Session]:
    """A sync session that commits on success and rolls back on error (tasks, CLI)."""
    with sync_sessionmaker(settings)() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def make_async_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def async_session_scope(maker: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    async with maker() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            raise
