"""What the autoscaler answers: how many replicas the pool needs, and why.

Where those replicas run (placement into GPU slots, the spot / on-demand market), which ones
stop on a scale-down and how nodes are consolidated are the fleet's decisions
(``controlplane.fleet``), made from this target.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Decision:
    target_replicas: int
    reasons: tuple[str, ...] = ()
    signals: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form the executor stores and the admin API shows."""
        return asdict(self)
