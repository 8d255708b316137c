"""Injected faults: the one mutable switchboard the engine and the HTTP layer both consult.

* ``health``: ``"fail"`` makes ``/health`` and ``/health_generate`` answer 503.
* ``hang``: the engine stops stepping (tokens stop flowing, health checks never answer).
* ``crash_after_tokens``: the process dies (exit code 70, no clean shutdown) as soon as any
  request has produced that many tokens, i.e. in the middle of its stream.
* ``slowdown``: every step takes this factor longer (a throttled or noisy-neighbour GPU).
* ``refuse``: new generation requests get 503 at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Faults:
    health: str = "ok"
    hang: bool = False
    crash_after_tokens: int | None = None
    slowdown: float = 1.0
    refuse: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)

    def as_dict(self) -> dict:
        # Not dataclasses.asdict: it would deep-copy the event and the futures waiting on it.
        return {"health": self.health, "hang": self.hang, "crash_after_tokens": self.crash_after_tokens,
                "slowdown": self.slowdown, "refuse": self.refuse}

    def update(self, patch: dict) -> None:
        """Apply a JSON patch from ``POST /_sim/faults``; unknown keys or bad values raise ValueError."""
        for key, value in patch.items():
            if key == "health":
                if value not in ("ok", "fail"):
                    raise ValueError("health must be 'ok' or 'fail'")
                self.health = value
            elif key in ("hang", "refuse"):
                setattr(self, key, bool(value))
            elif key == "crash_after_tokens":
                self.crash_after_tokens = None if value is None else int(value)
            elif key == "slowdown":
                if float(value) <= 0:
                    raise ValueError("slowdown must be positive")
                self.slowdown = float(value)
            else:
                raise ValueError(f"unknown fault {key!r}")
        self._notify()

    def clear(self) -> None:
        self.health, self.hang, self.crash_after_tokens = "ok", False, None
        self.slowdown, self.refuse = 1.0, False
        self._notify()

    def _notify(self) -> None:
        # Wake everything waiting on a change (a hung engine, a hung health check), then re-arm.
        self.changed.set()
        self.changed = asyncio.Event()
