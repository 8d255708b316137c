"""Edge signals for the autoscaler: what this edge sees of each served model, published to Redis.

The edge caps each replica at its batch slots and holds the rest in its fair queue, so the
engines never see that backlog; and only the edge measures TTFT as clients get it (its own
queueing included). Every ``signals_interval_s`` this edge publishes, per served model name:

* ``queue_depth``         requests waiting in the fair queue now;
* ``activation_waiting``  requests held while the pool starts from zero;
* ``inflight``            requests this edge has on the model's replicas;
* ``queue_wait``          wait in the fair queue of the requests that left it, over the window
                          (histogram plus p50/p90);
* ``ttft``                client-side time to first token of streamed requests (arrival at the
                          edge to first token), over the window (histogram plus p90);
* ``rejections``          429s and 503s over the window by ``"<status>/<code>"``.

Layout: a hash ``<prefix>edge-signals:<edge_id>`` with one JSON value per served model name
(models with nothing to report are left out), replaced whole on every publish and expiring
after ``ttl_s`` (3 × the interval), plus the sorted set ``<prefix>edge-signals`` of edge ids
scored by their last publish (wall-clock seconds). ``controlplane.fleet.edge_signals`` reads
and sums them across live edges.

Cost on the hot path: the hooks (``queue_wait``, ``ttft``, ``rejected``, ``holding``) are a
dict lookup and a bucket increment; the sums, the JSON and Redis happen in one background task.
A Redis failure is logged and the next interval tries again: no request ever waits on it or
fails because of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataplane.edge.metrics import LATENCY_BUCKETS

log = logging.getLogger("nimbus.edge.signals")

FORMAT_VERSION = 1
TTL_INTERVALS = 3  # a hash outlives its edge by this many intervals
INDEX_KEEP_S = 3600.0  # ids of edges silent for this long leave the index


def hash_key(prefix: str, edge_id: str) -> str:
    return f"{prefix}edge-signals:{edge_id}"


def index_key(prefix: str) -> str:
    return f"{prefix}edge-signals"


def default_edge_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


def histogram_quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """Quantile of a histogram with per-bucket (not cumulative) ``counts``, the last one +Inf;
    linear within the bucket, as Prometheus' ``histogram_quantile``. None when empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    cumulative = 0
    for i, count in enumerate(counts):
        if count and cumulative + count >= rank:
            if i >= len(bounds):
                return float(bounds[-1]) if bounds else None  # in +Inf: the highest finite bound
            lower = float(bounds[i - 1]) if i > 0 else 0.0
            return lower + (float(bounds[i]) - lower) * (rank - cumulative) / count
        cumulative += count
    return float(bounds[-1]) if bounds else None


@dataclass(slots=True)
class ModelWindow:
    """One served model's counts over one interval (or summed over the window)."""

    queue_wait: list[int]
    ttft: list[int]
    rejections: dict[str, int] = field(default_factory=dict)

    @classmethod
    def empty(cls, buckets: int) -> ModelWindow:
        return cls([0] * buckets, [0] * buckets)

    def add(self, other: ModelWindow) -> None:
        for i, n in enumerate(other.queue_wait):
            self.queue_wait[i] += n
        for i, n in enumerate(other.ttft):
            self.ttft[i] += n
        for reason, n in other.rejections.items():
            self.rejections[reason] = self.rejections.get(reason, 0) + n


class SignalRecorder:
    """Accumulates per served model in a ring of interval slots covering the window; the hooks
    only ever touch the newest slot. ``rotate`` (once per interval, by the publisher) opens a new
    slot and drops the oldest."""

    def __init__(self, window_s: float = 30.0, interval_s: float = 5.0,
                 bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = [float(b) for b in bounds]
        self.interval_s = interval_s
        self.slots = max(1, math.ceil(window_s / interval_s))
        self.window_s = self.slots * interval_s
        self._ring: deque[dict[str, ModelWindow]] = deque([{}], maxlen=self.slots)
        self.held: dict[str, int] = {}  # requests waiting for an activation, now (a gauge)

    def _current(self, model: str) -> ModelWindow:
        slot = self._ring[-1]
        window = slot.get(model)
        if window is None:
            window = slot[model] = ModelWindow.empty(len(self.bounds) + 1)
        return window

    # -- hot-path hooks
    def queue_wait(self, model: str, seconds: float) -> None:
        self._current(model).queue_wait[bisect_left(self.bounds, seconds)] += 1

    def ttft(self, model: str, seconds: float) -> None:
        self._current(model).ttft[bisect_left(self.bounds, seconds)] += 1

    def rejected(self, model: str, reason: str) -> None:
        rejections = self._current(model).rejections
        rejections[reason] = rejections.get(reason, 0) + 1

    def holding(self, model: str, delta: int) -> None:
        left = self.held.get(model, 0) + delta
        if left > 0:
            self.held[model] = left
        else:
            self.held.pop(model, None)

    # -- the publisher's side
    def rotate(self) -> None:
        self._ring.append({})

    def window(self) -> dict[str, ModelWindow]:
        total: dict[str, ModelWindow] = {}
        for slot in self._ring:
            for model, counts in slot.items():
                merged = total.get(model)
                if merged is None:
                    merged = total[model] = ModelWindow.empty(len(self.bounds) + 1)
                merged.add(counts)
        return total


@dataclass(frozen=True, slots=True)
class ModelGauges:
    """The instantaneous part, read from the edge's live state when publishing."""

    queue_depth: int = 0
    inflight: int = 0
    variant_id: str | None = None


def gauges_of(catalog: Any, admission: Any, router: Any) -> dict[str, ModelGauges]:
    """Queue depth and in-flight per served model name from the service's live objects."""
    if catalog is None:
        return {}
    queued: dict[str, int] = {}
    names: dict[str, str] = {}
    for variant_id, queue in admission.queues.items():
        variant = catalog.variants.get(variant_id)
        if variant is not None:
            names[variant.served_model_name] = variant_id
            queued[variant.served_model_name] = queued.get(variant.served_model_name, 0) + len(queue)
    inflight: dict[str, int] = {}
    for replica_id, load in router.loads.items():
        replica = catalog.replicas.get(replica_id)
        variant = catalog.variants.get(replica.variant_id) if replica is not None else None
        if variant is not None and load.inflight:
            names.setdefault(variant.served_model_name, variant.id)
            inflight[variant.served_model_name] = inflight.get(variant.served_model_name, 0) + load.inflight
    return {name: ModelGauges(queued.get(name, 0), inflight.get(name, 0), vid) for name, vid in names.items()}


def build_payloads(window: Mapping[str, ModelWindow], gauges: Mapping[str, ModelGauges],
                   held: Mapping[str, int], *, bounds: Sequence[float], edge_id: str, region: str,
                   ts: float, ttl_s: float, window_s: float) -> dict[str, str]:
    """One JSON value per served model with anything to report (the hash's fields)."""
    out: dict[str, str] = {}
    for model in sorted(set(window) | set(gauges) | set(held)):
        counts = window.get(model) or ModelWindow.empty(len(bounds) + 1)
        g = gauges.get(model) or ModelGauges()
        waiting = held.get(model, 0)
        if not (g.queue_depth or g.inflight or waiting or any(counts.queue_wait) or any(counts.ttft)
                or counts.rejections):
            continue
        out[model] = json.dumps({
            "v": FORMAT_VERSION, "edge": edge_id, "region": region, "ts": round(ts, 3), "ttl_s": ttl_s,
            "window_s": window_s, "variant_id": g.variant_id,
            "queue_depth": g.queue_depth, "activation_waiting": waiting, "inflight": g.inflight,
            "queue_wait": {"le": list(bounds), "counts": counts.queue_wait,
                           "p50": histogram_quantile(bounds, counts.queue_wait, 0.5),
                           "p90": histogram_quantile(bounds, counts.queue_wait, 0.9)},
            "ttft": {"le": list(bounds), "counts": counts.ttft,
                     "p90": histogram_quantile(bounds, counts.ttft, 0.9)},
            "rejections": dict(sorted(counts.rejections.items())),
        }, separators=(",", ":"))
    return out


class SignalPublisher:
    """The background task: every interval, the window and the gauges go to Redis in one
    MULTI/EXEC (so a reader never sees a half-replaced hash), then the ring rotates."""

    def __init__(self, redis_client: Any, recorder: SignalRecorder, gauges: Callable[[], Mapping[str, ModelGauges]],
                 *, edge_id: str, region: str, prefix: str, interval_s: float,
                 on_result: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.redis = redis_client
        self.recorder = recorder
        self.gauges = gauges
        self.edge_id = edge_id
        self.region = region
        self.prefix = prefix
        self.interval_s = interval_s
        self.ttl_s = TTL_INTERVALS * interval_s
        self.on_result = on_result
        self.clock = clock
        self.published = 0
        self.failures = 0
        self._failing = False
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        # Leave at once rather than after the TTL: a stopped edge holds no queue.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._withdraw(), 1.0)

    async def _run(self) -> None:
        while True:
            await self.publish_once()
            self.recorder.rotate()
            await asyncio.sleep(self.interval_s)

    def fields(self) -> dict[str, str]:
        r = self.recorder
        return build_payloads(r.window(), self.gauges(), r.held, bounds=r.bounds, edge_id=self.edge_id,
                              region=self.region, ts=self.clock(), ttl_s=self.ttl_s, window_s=r.window_s)

    async def publish_once(self) -> bool:
        try:
            fields = self.fields()
            ts = self.clock()
            key = hash_key(self.prefix, self.edge_id)
            index = index_key(self.prefix)
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                if fields:
                    pipe.hset(key, mapping=fields)
                    pipe.expire(key, math.ceil(self.ttl_s))
                pipe.zadd(index, {self.edge_id: ts})
                pipe.zremrangebyscore(index, "-inf", ts - INDEX_KEEP_S)
                pipe.expire(index, math.ceil(INDEX_KEEP_S))
                await pipe.execute()
        except Exception as exc:  # Redis down or slow, or a bug here: never the request path's problem
            self.failures += 1
            if not self._failing:
                log.warning("edge signals not published (trying every %.0fs): %r", self.interval_s, exc)
            self._failing = True
            self._report(False)
            return False
        if self._failing:
            log.info("edge signals published again")
        self._failing = False
        self.published += 1
        self._report(True)
        return True

    def _report(self, ok: bool) -> None:
        if self.on_result is not None:
            with contextlib.suppress(Exception):
                self.on_result(ok)

    async def _withdraw(self) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(hash_key(self.prefix, self.edge_id))
            pipe.zrem(index_key(self.prefix), self.edge_id)
            await pipe.execute()


def rejection_reason(status: int, code: str | None) -> str:
    return f"{status}/{code or 'unknown'}"
