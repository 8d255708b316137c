"""One typed settings object for every Nimbus process, read from ``NIMBUS_*`` variables.

With nothing set, Nimbus runs embedded: a SQLite file and local Celery transport under
``.nimbus/``. Production points the same code at Postgres and Redis by URL only.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NIMBUS_", extra="ignore")

    state_dir: Path = Field(default=Path(".nimbus"), description="Embedded mode state: SQLite, broker files.")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db. Default: SQLite under state_dir.",
    )
    broker_url: str | None = Field(
        default=None, description="Celery broker. Default: a filesystem transport under state_dir."
    )
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", description="Limits and the usage stream.")
    usage_stream: str = Field(default="nimbus:usage", description="Redis stream the edges write usage to.")
    admin_token: SecretStr = Field(
        default=SecretStr(""), description="Bearer token of the admin API. Empty disables the admin API."
    )
    edge_token: SecretStr = Field(
        default=SecretStr(""), description="Bearer token edges use for the internal snapshot API."
    )
    session_secret: SecretStr = Field(
        default=SecretStr(""), description="Signs console session cookies; generated per state dir if empty."
    )
    public_url: str = Field(default="http://127.0.0.1:8000", description="Where agents reach the control plane.")
    edge_url: str = Field(
        default="http://127.0.0.1:8080", description="An edge proxy the console's playground streams through."
    )
    cluster_name: str = Field(default="nimbus", description="Ownership tag on every VM this cluster launches.")
    key_cache_seconds: float = Field(default=5.0, description="How long a verified API key stays cached.")
    db_pool_size: int = Field(default=10, ge=1)
    sql_echo: bool = False

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.state_dir / 'nimbus.db').resolve()}"

    @property
    def is_sqlite(self) -> bool:
        return self.resolved_database_url.startswith("sqlite")


@functools.cache
def get_settings() -> Settings:
    return Settings()
