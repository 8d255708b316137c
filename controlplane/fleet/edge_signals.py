"""The edges' signals for the autoscaler, read from Redis and summed across live edges.

Every edge publishes, per served model name, its fair-queue depth, the requests it holds for an
activation, its in-flight requests, and over its last window the queue-wait and client-side TTFT
histograms and its 429/503 rejections (``dataplane/edge/signals.py`` has the layout): a hash
``<prefix>edge-signals:<edge_id>`` that expires a few intervals after the edge stops, indexed by
the sorted set ``<prefix>edge-signals``.

``read_edge_signals`` returns ``{served model name: EdgeSignals}`` for the policy
(``PoolObservation.edge``): counts and gauges summed, histograms merged before their quantiles
are taken, edges whose last publish is older than its TTL (or ``max_age_s``) left out. If Redis
cannot be read it returns an empty answer whose ``error`` says why (and logs it): the policy then
decides from the engines' signals alone, as before edges published anything.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controlplane.autoscaler.signals import EdgeSignals

log = logging.getLogger("nimbus.fleet.edge_signals")

DEFAULT_PREFIX = "nimbus:"
INDEX_LOOKBACK_S = 3600.0  # ids scored older than this are not even looked up (the edges prune them)
DEFAULT_TTL_S = 15.0  # an edge's TTL when it published nothing to read it from (3 × its default interval)
WARN_EVERY_S = 300.0  # while Redis stays unreadable, say so at most this often (every tick: debug)
_last_warning: dict[str, float] = {}


@functools.cache
def redis_client(url: str) -> Any:
    """A synchronous client with short timeouts, one per URL: a hung Redis must not hold the
    autoscaler's tick (and its row locks) for long."""
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=0.25, socket_timeout=0.5, retry_on_timeout=False)


class EdgeReadout(dict[str, EdgeSignals]):
    """``{served model name: EdgeSignals}`` plus how the read went."""

    def __init__(self, signals: Mapping[str, EdgeSignals] | None = None, *, live_edges: int = 0,
                 stale_edges: int = 0, error: str | None = None) -> None:
        super().__init__(signals or {})
        self.live_edges = live_edges
        self.stale_edges = stale_edges
        self.error = error


def _epoch(t: float | dt.datetime) -> float:
    return t.timestamp() if isinstance(t, dt.datetime) else float(t)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def histogram_quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """Quantile of per-bucket (not cumulative) ``counts``, the last bucket +Inf; linear within the
    bucket as Prometheus' ``histogram_quantile`` (the edge computes its own p50/p90 the same way)."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    cumulative = 0
    for i, count in enumerate(counts):
        if count and cumulative + count >= rank:
            if i >= len(bounds):
                return float(bounds[-1]) if bounds else None
            lower = float(bounds[i - 1]) if i > 0 else 0.0
            return lower + (float(bounds[i]) - lower) * (rank - cumulative) / count
        cumulative += count
    return float(bounds[-1]) if bounds else None


def is_fresh(payload: Mapping[str, Any], now: float | dt.datetime, max_age_s: float | None = None) -> bool:
    """Published within its TTL (or ``max_age_s`` when that is given). A timestamp ahead of ``now``
    (clocks a little apart) counts as fresh; Redis expires the hash on its own clock anyway."""
    limit = max_age_s if max_age_s is not None else float(payload.get("ttl_s") or DEFAULT_TTL_S)
    return _epoch(now) - float(payload.get("ts") or 0.0) <= limit


def _merge_histograms(parts: list[Mapping[str, Any]], qs: Sequence[float]) -> tuple[list[float | None], int]:
    """Quantiles of the merged histogram, and its count. Edges of another version with other
    bucket bounds cannot be merged bucket by bucket: then the worst quantile any edge reported."""
    parts = [p for p in parts if p]
    if not parts:
        return [None] * len(qs), 0
    bounds = [tuple(p.get("le") or ()) for p in parts]
    total = sum(sum(p.get("counts") or ()) for p in parts)
    if len(set(bounds)) == 1:
        merged = [sum(col) for col in zip(*(p.get("counts") or () for p in parts), strict=True)]
        return [histogram_quantile(bounds[0], merged, q) for q in qs], total
    out: list[float | None] = []
    for q in qs:
        reported = [histogram_quantile(b, p.get("counts") or (), q) for b, p in zip(bounds, parts, strict=True)]
        known = [v for v in reported if v is not None]
        out.append(max(known) if known else None)
    return out, total


def combine(edges: Iterable[Mapping[str, Mapping[str, Any]]]) -> dict[str, EdgeSignals]:
    """Sum the edges' payloads (one ``{served model name: payload}`` per edge, already judged
    live) into one ``EdgeSignals`` per served model name. Pure."""
    by_model: dict[str, list[Mapping[str, Any]]] = {}
    for payloads in edges:
        for model, payload in payloads.items():
            by_model.setdefault(model, []).append(payload)
    out: dict[str, EdgeSignals] = {}
    for model, parts in by_model.items():
        (wait_p50, wait_p90), _ = _merge_histograms([p.get("queue_wait") or {} for p in parts], (0.5, 0.9))
        (ttft_p90,), ttft_samples = _merge_histograms([p.get("ttft") or {} for p in parts], (0.9,))
        rejections: dict[str, int] = {}
        for p in parts:
            for reason, n in (p.get("rejections") or {}).items():
                rejections[reason] = rejections.get(reason, 0) + int(n)
        out[model] = EdgeSignals(
            edges=len(parts),
            queue_depth=sum(int(p.get("queue_depth") or 0) for p in parts),
            activation_waiting=sum(int(p.get("activation_waiting") or 0) for p in parts),
            inflight=sum(int(p.get("inflight") or 0) for p in parts),
            queue_wait_p50_s=wait_p50,
            queue_wait_p90_s=wait_p90,
            ttft_p90_s=ttft_p90,
            ttft_samples=ttft_samples,
            rejections=dict(sorted(rejections.items())),
            window_s=max(float(p.get("window_s") or 0.0) for p in parts),
        )
    return out


def _say_unavailable(exc: BaseException) -> None:
    wall = time.monotonic()
    if wall - _last_warning.get("redis", -WARN_EVERY_S) >= WARN_EVERY_S:
        _last_warning["redis"] = wall
        log.warning("edge signals unavailable, the autoscaler decides from the engines alone: %r", exc)
    else:
        log.debug("edge signals unavailable: %r", exc)


def read_edge_signals(redis_client: Any, now: float | dt.datetime, *, prefix: str = DEFAULT_PREFIX,
                      max_age_s: float | None = None) -> EdgeReadout:
    """``{served model name: EdgeSignals}`` summed over the edges that published within their TTL
    (or ``max_age_s``). ``redis_client`` is a synchronous ``redis.Redis`` (either
    ``decode_responses``). Never raises for Redis: an unreachable or failing Redis gives an empty
    readout with ``error`` set, and a warning in the log."""
    t = _epoch(now)
    index = f"{prefix}edge-signals"
    try:
        scored = redis_client.zrangebyscore(index, t - INDEX_LOOKBACK_S, "+inf", withscores=True)
        ids = [(_text(i), float(score)) for i, score in scored]
        pipe = redis_client.pipeline(transaction=False)
        for edge_id, _ in ids:
            pipe.hgetall(f"{prefix}edge-signals:{edge_id}")
        hashes = pipe.execute() if ids else []
    except Exception as exc:  # redis.RedisError, OSError: the policy goes on without the edges
        _say_unavailable(exc)
        return EdgeReadout(error=f"redis: {exc!r}")
    live: list[dict[str, Mapping[str, Any]]] = []
    live_edges = stale_edges = 0
    for (edge_id, published_at), raw in zip(ids, hashes, strict=True):
        payloads: dict[str, Mapping[str, Any]] = {}
        ttl = DEFAULT_TTL_S
        for field_name, value in (raw or {}).items():
            try:
                payload = json.loads(_text(value))
            except ValueError:
                log.warning("edge %s published an unreadable entry for %r", edge_id, _text(field_name))
                continue
            ttl = float(payload.get("ttl_s") or ttl)
            if is_fresh(payload, t, max_age_s):
                payloads[_text(field_name)] = payload
        # An edge with nothing to report publishes an empty hash: alive, all zero.
        if payloads or t - published_at <= (max_age_s if max_age_s is not None else ttl):
            live_edges += 1
        else:
            stale_edges += 1
        if payloads:
            live.append(payloads)
    return EdgeReadout(combine(live), live_edges=live_edges, stale_edges=stale_edges)
