from controlplane.db.base import Base
from controlplane.db.engine import session_scope, sync_sessionmaker
from controlplane.db.types import utcnow

__all__ = ["Base", "session_scope", "sync_sessionmaker", "utcnow"]
