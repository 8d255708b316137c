"""Admission: dispatch at once when a replica has room, otherwise wait in a bounded, fair queue.

One ``FairQueue`` per model variant (requests for different variants never block each other).
``pump()`` runs whenever capacity may have appeared (a request finished, health or a snapshot
changed, and on a short timer as a safety net) and dispatches waiters in VTC order (within a
tenant, deadline-first: ``fairness.py``) for as long as they fit. New arrivals queue behind
existing waiters, so nobody can jump the fair order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from dataplane.edge import errors
from dataplane.edge.fairness import FairQueue, Waiter


class Admission:
    def __init__(self, queue_max: int, timeout_s: float, clock: Callable[[], float]) -> None:
        self.queue_max = queue_max
        self.timeout_s = timeout_s
        self.clock = clock
        self.queues: dict[str, FairQueue] = {}
        self._futures: dict[int, asyncio.Future] = {}
        self._ticker: asyncio.Task | None = None
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}  # variant -> (due, handle)

    def queue(self, variant_id: str) -> FairQueue:
        q = self.queues.get(variant_id)
        if q is None:
            q = self.queues[variant_id] = FairQueue(self.queue_max)
        return q

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    async def admit(self, variant_id: str, waiter: Waiter) -> Any:
        """Return what ``waiter.try_dispatch`` returned, or raise 503 when the queue is full or the wait
        times out."""
        assert waiter.try_dispatch is not None
        q = self.queue(variant_id)
        if not len(q):
            result = waiter.try_dispatch(self.clock())
            if result:
                return result
        if not q.push(waiter):
            raise errors.unavailable("The edge's queue for this model is full; retry shortly.", 2.0)
        fut = asyncio.get_running_loop().create_future()
        self._futures[waiter.seq] = fut
        self.pump(variant_id)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
        except TimeoutError:
            if q.remove(waiter):
                raise errors.unavailable(
                    "Every replica of this model is busy and the request waited too long.",
                    retry_after_s=max(1.0, self.timeout_s / 4), code="queue_timeout") from None
            return fut.result()  # dispatched in the same instant the timer fired
        except asyncio.CancelledError:
            # If it was dispatched in the meantime, try_dispatch recorded that on the caller's side,
            # whose cleanup releases it.
            q.remove(waiter)
            raise
        finally:
            self._futures.pop(waiter.seq, None)

    def pump(self, variant_id: str | None = None) -> int:
        """Dispatch as many waiters as fit; returns how many went."""
        sent = 0
        targets = [variant_id] if variant_id is not None else list(self.queues)
        for vid in targets:
            q = self.queues.get(vid)
            while q and len(q):
                progressed = False
                now = self.clock()
                for head in q.heads(now):
                    fut = self._futures.get(head.seq)
                    if fut is None or fut.done():
                        q.remove(head)  # its caller already gave up
                        progressed = True
                        break
                    assert head.try_dispatch is not None
                    result = head.try_dispatch(now)
                    if result:
                        q.remove(head)
                        fut.set_result(result)
                        sent += 1
                        progressed = True
                        break
                if not progressed:
                    break
        return sent

    def pump_at(self, variant_id: str, delay_s: float) -> None:
        """Pump ``variant_id``'s queue once after ``delay_s``: one timer per variant, moved earlier
        when a nearer time is asked for. The due time is kept beside the handle: uvloop's timer
        handles have no ``when()``."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay_s)
        pending = self._timers.get(variant_id)
        if pending is not None:
            if pending[0] <= when:
                return
            pending[1].cancel()

        def fire() -> None:
            self._timers.pop(variant_id, None)
            self.pump(variant_id)
        self._timers[variant_id] = (when, loop.call_at(when, fire))

    def start_ticker(self, interval_s: float = 0.05) -> None:
        async def tick() -> None:
            while True:
                await asyncio.sleep(interval_s)
                if self.queued():
                    self.pump()

        self._ticker = asyncio.create_task(tick())

    async def stop(self) -> None:
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._ticker:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker

