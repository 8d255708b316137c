"""Who is calling: the admin, or one tenant through one of its keys."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Principal:
    kind: str  # "admin" | "tenant" | "system"
    tenant_id: uuid.UUID | None = None
    key_id: uuid.UUID | None = None
    key_prefix: str | None = None
    scopes: frozenset[str] = field(default_factory=frozenset)

    @property
    def actor(self) -> str:
        if self.kind == "tenant":
            return f"tenant:{self.tenant_id} key:{self.key_prefix}"
        return self.kind


ADMIN = Principal(kind="admin")
SYSTEM = Principal(kind="system")
