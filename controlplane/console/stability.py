"""Where the sweeper stopped evicting silent nodes, for the operator console and the API's /metrics.

The sweeper (``controlplane/fleet/sweeper.py``, in the Celery worker) writes a
``fleet.evictions_paused`` audit event when too many of a scope's nodes are silent at once to
trust silence (the API may be the one failing), and ``fleet.evictions_resumed`` when they report
again. The latest event per scope is that scope's state; this module reads it.

``nimbus_fleet_evictions_paused{scope}`` is exported by the API process too (the worker has no
``/metrics`` of its own): a collector reads the same events, at most every ``CACHE_S`` seconds,
through the settings of the app that last served an operator page or an agent call.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.engine import session_scope
from controlplane.models.audit import EVICTIONS_PAUSED, latest_eviction_scope_events

log = logging.getLogger("nimbus.console.stability")
CACHE_S = 10.0


@dataclass(frozen=True)
class EvictionPause:
    scope: str  # "fleet" or "<cloud>/<region>"
    since: dt.datetime
    silent: int
    nodes: int
    share: float
    threshold: float


def pauses_from(rows: Any) -> list[EvictionPause]:
    """The scopes whose latest event is a pause, from ``latest_eviction_scope_events`` rows."""
    seen: set[str] = set()
    out: list[EvictionPause] = []
    for target_id, action, at, after in rows:
        if target_id in seen:
            continue
        seen.add(target_id)
        if action == EVICTIONS_PAUSED:
            after = after or {}
            out.append(EvictionPause(scope=target_id, since=at, silent=int(after.get("silent") or 0),
                                     nodes=int(after.get("nodes") or 0), share=float(after.get("share") or 0.0),
                                     threshold=float(after.get("threshold") or 0.0)))
    return sorted(out, key=lambda p: (p.scope != "fleet", p.scope))


async def eviction_pauses(db: AsyncSession) -> list[EvictionPause]:
    return pauses_from((await db.execute(latest_eviction_scope_events())).all())


class _PausedCollector:
    """``nimbus_fleet_evictions_paused{scope}`` read from the database, cached."""

    def __init__(self) -> None:
        self._settings: Any = None
        self._lock = threading.Lock()
        self._cached: tuple[float, list[EvictionPause]] | None = None

    def bind(self, settings: Any) -> None:
        if self._settings is not settings:
            self._settings, self._cached = settings, None

    def describe(self) -> list:
        return [GaugeMetricFamily("nimbus_fleet_evictions_paused", "1 while the sweeper evicts no silent node in "
                                  "the scope (too many of its nodes silent at once)", labels=["scope"])]

    def _read(self) -> list[EvictionPause]:
        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < CACHE_S:
                return self._cached[1]
            with session_scope(self._settings) as session:
                pauses = pauses_from(session.execute(latest_eviction_scope_events()).all())
            self._cached = (time.monotonic(), pauses)
            return pauses

    def collect(self):
        family = self.describe()[0]
        if self._settings is None:
            yield family
            return
        try:
            pauses = self._read()
        except Exception as exc:  # the database is down: no sample rather than a failed scrape
            log.debug("eviction pauses unreadable: %r", exc)
            yield family
            return
        family.add_metric(["fleet"], 1.0 if any(p.scope == "fleet" for p in pauses) else 0.0)
        for p in pauses:
            if p.scope != "fleet":
                family.add_metric([p.scope], 1.0)
        yield family


PAUSED = _PausedCollector()
try:
    REGISTRY.register(PAUSED)
except ValueError:  # registered already (a module reloaded in tests)
    pass
