"""Prometheus metrics of the edge (one registry per app, so several edges can live in one process)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 21, 34, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2)


class LoopHistogram:
    """A histogram observed once per streamed token. prometheus_client's ``Histogram.observe`` takes
    two locks per call; the edge observes from its one event-loop thread only, so plain counters
    suffice. Exposed through the registry as a collector, in the usual histogram shape."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self.bounds = [float(b) for b in buckets]
        self._series: dict[tuple[str, ...], LoopHistogram.Series] = {}
        registry.register(self)

    class Series:
        __slots__ = ("bounds", "counts", "sum")

        def __init__(self, bounds: list[float]) -> None:
            self.bounds = bounds
            self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
            self.sum = 0.0

        def observe(self, value: float) -> None:
            self.counts[bisect_left(self.bounds, value)] += 1  # le="b" counts value <= b
            self.sum += value

    def labels(self, *values: str) -> LoopHistogram.Series:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = LoopHistogram.Series(self.bounds)
        return series

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in list(self._series.items()):
            cumulative, buckets = 0, []
            for bound, count in zip([*self.bounds, float("inf")], series.counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            family.add_metric(list(values), buckets, series.sum)
        yield family

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]


class EdgeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._children: dict[tuple, object] = {}
        self.requests = Counter("nimbus_edge_requests", "Finished requests", ["model", "priority", "status", "code"],
                                registry=r)
        self.ttft = Histogram("nimbus_edge_ttft_seconds", "Time to first token as the client sees it",
                              ["model", "replica", "priority"], buckets=LATENCY_BUCKETS, registry=r)
        self.itl = LoopHistogram("nimbus_edge_inter_token_seconds", "Gap between streamed chunks",
                                 ["model", "replica", "priority"], ITL_BUCKETS, r)
        self.queue_time = Histogram("nimbus_edge_queue_seconds", "Time waiting in the edge's fair queue",
                                    ["model", "priority"], buckets=LATENCY_BUCKETS, registry=r)
        self.dispatched_late = Counter(
            "nimbus_edge_dispatched_late", "Requests that left the fair queue past the last moment they could "
            "meet their pool's TTFT SLO (served after those that still could)", ["model", "priority"], registry=r)
        self.duration = Histogram("nimbus_edge_request_seconds", "Whole request duration",
                                  ["model", "priority"], buckets=LATENCY_BUCKETS, registry=r)
        self.errors = Counter("nimbus_edge_errors", "Errors by kind", ["model", "replica", "kind"], registry=r)
        self.retries = Counter("nimbus_edge_retries", "Retries on another replica before the first byte",
                               ["model", "reason"], registry=r)
        self.degraded_dispatches = Counter(
            "nimbus_edge_degraded_dispatches", "Requests sent past the health filter because no healthy replica "
            "of a healthy region was left (reason: failing_region, unhealthy)", ["model", "reason"], registry=r)
        self.retry_denied = Counter("nimbus_edge_retry_budget_exhausted", "Retries refused by the retry budget",
                                    ["model"], registry=r)
        self.routed = Counter("nimbus_edge_routing_decisions", "Routing decisions",
                              ["model", "replica", "policy"], registry=r)
        self.prompt_tokens = Counter("nimbus_edge_prompt_tokens", "Prompt tokens reported by engines",
                                     ["model", "replica"], registry=r)
        self.est_prefix_hit_tokens = Counter(
            "nimbus_edge_estimated_prefix_hit_tokens", "Prompt tokens the router predicted to be cached",
            ["model", "replica"], registry=r)
        self.cached_tokens = Counter("nimbus_edge_cached_tokens", "Cached prompt tokens reported by engines",
                                     ["model", "replica"], registry=r)
        self.completion_tokens = Counter("nimbus_edge_completion_tokens", "Generated tokens",
                                         ["model", "replica"], registry=r)
        self.inflight = Gauge("nimbus_edge_inflight", "Requests in flight per replica", ["replica"], registry=r)
        self.queue_depth = Gauge("nimbus_edge_queue_depth", "Requests waiting in the fair queue", registry=r)
        self.rate_limited = Counter("nimbus_edge_rate_limited", "429s by limit", ["reason"], registry=r)
        self.limits_fallback = Counter("nimbus_edge_limits_local_decisions",
                                       "Limit decisions taken without Redis", registry=r)
        self.replica_healthy = Gauge("nimbus_edge_replica_healthy", "1 when the replica passes health checks",
                                     ["replica", "region"], registry=r)
        self.breaker_open = Gauge("nimbus_edge_breaker_open", "1 while the replica's breaker is open",
                                  ["replica"], registry=r)
        self.snapshot_age = Gauge("nimbus_edge_snapshot_age_seconds", "Seconds since the last good snapshot",
                                  registry=r)
        self.activations = Counter("nimbus_edge_activations", "Scale-from-zero activations requested",
                                   ["model"], registry=r)
        self.cache_hits = Counter("nimbus_edge_response_cache_hits", "Response cache hits, exact and semantic",
                                  ["model"], registry=r)
        self.semantic_scores = Histogram("nimbus_edge_semantic_cache_similarity",
                                         "Cosine similarity of semantic cache hits (its count: the semantic hits)",
                                         ["model"], buckets=(0.8, 0.85, 0.9, 0.92, 0.94, 0.96, 0.98, 0.99, 1.0),
                                         registry=r)
        self.unauthenticated = Counter("nimbus_edge_unauthenticated", "Requests without valid credentials by answer "
                                       "(401; 429 once the client address is past its rate)", ["code"], registry=r)
        self.poison = Counter("nimbus_edge_request_faults", "Engine failures judged the request's own (a 4xx, or the "
                              "same failure on a second replica), by kind", ["model", "kind"], registry=r)
        self.upstream_paused = Counter("nimbus_edge_upstream_pauses", "Times a stream's engine connection was paused "
                                       "because its client fell behind", registry=r)
        self.signals_published = Counter("nimbus_edge_signals_publishes",
                                         "Autoscaler signal publishes to Redis by result", ["result"], registry=r)

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, cached: label lookups are a measurable cost per token otherwise."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)
