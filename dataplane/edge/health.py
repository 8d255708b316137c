"""Model-level health checks, built so that checking never removes capacity when load peaks.

* **Passive first.** A replica this edge saw produce output (a first byte, a streamed chunk, a
  finished answer) since the last round is healthy by that evidence: it gets only the cheap
  ``/health`` round trip (reachability, and the measured RTT for regions without a configured
  one), not a ``/health_generate`` that would queue a generation on a busy engine.
* **The active probe decides for replicas without traffic.** ``/health`` then ``/health_generate``
  (a real one-token generation; SGLang answers it once the engine makes any progress).
* **Slow is not dead** (``judge``). A probe that times out while the replica kept making progress
  on this edge's requests lowers the replica's score (``router.PROBE_SLOW``) instead of ejecting
  it. It fails only if nothing it serves progressed for ``health_stall_s`` (hung). A refused
  connection ejects at once (``PROBE_DEAD``); a 5xx counts towards ``health_failures_to_down``.

The verdicts feed the router, which also never fails closed: see ``Router.eligible``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from dataplane.edge.catalog import Catalog, Replica
from dataplane.edge.router import PROBE_DEAD, PROBE_FAILED, PROBE_OK, PROBE_SLOW, Router

log = logging.getLogger("nimbus.edge.health")


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What one probe saw. ``generate_status`` is None when ``/health_generate`` was not sent
    (passive evidence sufficed, or an earlier step already failed)."""

    connected: bool
    timed_out: bool = False
    health_status: int | None = None
    generate_status: int | None = None
    rtt_ms: float | None = None


def judge(result: ProbeResult, started: float, now: float, last_progress: float, inflight: int,
          stall_s: float, busy_since: float = float("-inf")) -> str:
    """One probe's verdict (a pure function of what the probe and the edge's own traffic saw).
    A timed-out probe is *slow* when output arrived while it waited, or when the replica carries
    traffic that has not been silent for ``stall_s`` (timed from its last output, or from when it
    became busy if that is later: new requests on a saturated engine wait in its queue first)."""
    if not result.connected:
        return PROBE_DEAD
    if result.timed_out:
        silent_since = max(last_progress, busy_since)
        progressing = last_progress >= started or (inflight > 0 and now - silent_since < stall_s)
        return PROBE_SLOW if progressing else PROBE_FAILED
    if result.health_status != 200 or result.generate_status not in (None, 200):
        return PROBE_FAILED
    return PROBE_OK


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
        self._fresh: aiohttp.ClientSession | None = None  # no keep-alive: tells "refused" from "reset"

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self.timeout)
        self._fresh = aiohttp.ClientSession(timeout=self.timeout, connector=aiohttp.TCPConnector(force_close=True))
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for session in (self._session, self._fresh):
            if session:
                await session.close()

    async def _loop(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.interval_s)

    async def check_all(self) -> None:
        catalog = self.get_catalog()
        if catalog is None or not catalog.replicas:
            return
        targets = [r for r in catalog.replicas.values() if r.state == "ready"]
        started = time.monotonic()
        # Output seen since the previous round vouches for the engine: no generation is queued on it.
        vouched = {r.id for r in targets if self.router.load(r.id).last_progress >= started - self.interval_s}
        results = await asyncio.gather(*(self.probe(r, generate=r.id not in vouched) for r in targets),
                                       return_exceptions=True)
        now = time.monotonic()
        changed = False
        for replica, res in zip(targets, results, strict=True):
            result = res if isinstance(res, ProbeResult) else ProbeResult(connected=True, health_status=None)
            load = self.router.load(replica.id)
            verdict = judge(result, started, now, load.last_progress, load.inflight,
                            self.router.settings.health_stall_s, load.busy_since)
            self.on_probe(replica, verdict in (PROBE_OK, PROBE_SLOW))
            if verdict == PROBE_SLOW:
                log.info("replica %s (%s) is slow: its probe timed out while it kept serving", replica.id, replica.url)
            if self.router.mark_health(replica.id, verdict, result.rtt_ms):
                changed = True
                log.warning("replica %s (%s) is now %s (%s)", replica.id, replica.url,
                            "healthy" if self.router.health_of(replica.id).healthy else "unhealthy", verdict)
        if changed:
            self.on_change()

    async def probe(self, replica: Replica, generate: bool = True) -> ProbeResult:
        assert self._session is not None
        rtt = None
        try:
            t0 = time.perf_counter()
            async with self._session.get(replica.url + "/health") as resp:
                await resp.read()
                rtt = (time.perf_counter() - t0) * 1000
                if resp.status != 200 or not generate:
                    return ProbeResult(True, health_status=resp.status, rtt_ms=rtt)
            async with self._session.get(replica.url + "/health_generate") as resp:
                await resp.read()
                return ProbeResult(True, health_status=200, generate_status=resp.status, rtt_ms=rtt)
        except aiohttp.ClientConnectorError:
            return ProbeResult(False, rtt_ms=rtt)
        except TimeoutError:
            return ProbeResult(True, timed_out=True, rtt_ms=rtt)
        except (aiohttp.ClientError, OSError):
            # A kept-alive connection broke: a process that died resets it. Only a new connection
            # tells a dead replica (refused) from a flaky moment (it answers).
            return ProbeResult(await self._connects(replica), rtt_ms=rtt)

    async def _connects(self, replica: Replica) -> bool:
        assert self._fresh is not None
        try:
            async with self._fresh.get(replica.url + "/health") as resp:
                await resp.read()
        except aiohttp.ClientConnectorError:
            return False
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass
        return True
