"""What the autoscaler answers: plain dataclasses the executor turns into provisioning work."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class AddReplica:
    spot: bool
    reason: str
    node_id: str | None = None  # an existing node with free GPUs; None: launch a new node


@dataclass(frozen=True)
class Move:
    """Consolidation: start a replacement on ``to_node``; drain ``replica_id`` once it is ready."""

    replica_id: str
    from_node: str
    to_node: str


@dataclass(frozen=True)
class Decision:
    target_replicas: int
    add: tuple[AddReplica, ...] = ()
    drain: tuple[str, ...] = ()  # replica ids; the executor removes a replica only after its drain
    consolidate: tuple[Move, ...] = ()
    reasons: tuple[str, ...] = ()
    signals: dict[str, Any] = field(default_factory=dict)

    @property
    def changes_capacity(self) -> bool:
        return bool(self.add or self.drain)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form the executor stores and the admin API shows."""
        return asdict(self)
