"""Model-level health checks: each replica's ``/health_generate`` (a real one-token generation),
plus a cheap ``/health`` round trip whose time is the measured RTT for regions without a
configured one. Results feed the router (unhealthy replicas and failing regions drop out)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp

from dataplane.edge.catalog import Catalog, Replica
from dataplane.edge.router import Router

log = logging.getLogger("nimbus.edge.health")


class HealthMonitor:
    def __init__(self, router: Router, get_catalog: Callable[[], Catalog | None], interval_s: float,
                 timeout_s: float, on_change: Callable[[], None], on_probe: Callable[[Replica, bool], None]) -> None:
        self.router = router
        self.get_catalog = get_catalog
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.on_change = on_change
        self.on_probe = on_probe
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self.timeout)
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session:
            await self._session.close()

    async def _loop(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.interval_s)

    async def check_all(self) -> None:
        catalog = self.get_catalog()
        if catalog is None or not catalog.replicas:
            return
        targets = [r for r in catalog.replicas.values() if r.state == "ready"]
        results = await asyncio.gather(*(self.probe(r) for r in targets), return_exceptions=True)
        changed = False
        for replica, res in zip(targets, results, strict=True):
            ok, rtt = (False, None) if isinstance(res, BaseException) else res
            self.on_probe(replica, ok)
            if self.router.mark_health(replica.id, ok, rtt):
                changed = True
                log.warning("replica %s (%s) is now %s", replica.id, replica.url, "healthy" if ok else "unhealthy")
        if changed:
            self.on_change()

    async def probe(self, replica: Replica) -> tuple[bool, float | None]:
        assert self._session is not None
        rtt = None
        try:
            t0 = time.perf_counter()
            async with self._session.get(replica.url + "/health") as resp:
                await resp.read()
                rtt = (time.perf_counter() - t0) * 1000
                if resp.status != 200:
                    return False, rtt
            async with self._session.get(replica.url + "/health_generate") as resp:
                await resp.read()
                return resp.status == 200, rtt
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False, rtt
