"""Engine ``/metrics`` (SGLang names) → the numbers a heartbeat carries.

Gauges are reported as read; counters and histograms as deltas since the previous scrape, so
the control plane can sum heartbeats without knowing when an engine restarted (a counter that
went backwards means a restart: the new value is the delta).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "sglang:"
GAUGES = ("num_running_reqs", "num_queue_reqs", "token_usage", "num_used_tokens", "cache_hit_rate",
          "gen_throughput", "max_total_num_tokens")
COUNTERS = ("prompt_tokens", "generation_tokens", "cached_tokens", "num_requests")
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "queue_time_seconds")


@dataclass
class Histogram:
    buckets: dict[str, float] = field(default_factory=dict)  # cumulative counts by "le"
    sum: float = 0.0
    count: float = 0.0


@dataclass
class Sample:
    """One scrape, summed over label sets (one engine serves one model name)."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)


def parse(text: str) -> Sample:
    sample = Sample()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        name = family.name[len(PREFIX):]
        if family.type == "gauge" and name in GAUGES:
            sample.gauges[name] = sum(s.value for s in family.samples)
        elif family.type == "counter" and name in COUNTERS:
            sample.counters[name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
        elif family.type == "histogram" and name in HISTOGRAMS:
            h = sample.histograms.setdefault(name, Histogram())
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    le = s.labels["le"]
                    h.buckets[le] = h.buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_sum"):
                    h.sum += s.value
                elif s.name.endswith("_count"):
                    h.count += s.value
    return sample


def _delta(now: float, before: float | None) -> float:
    if before is None or now < before:  # first scrape, or the engine restarted
        return now
    return now - before


def heartbeat_metrics(now: Sample, before: Sample | None, interval_s: float) -> dict:
    """The replica metrics a heartbeat carries: gauges, per-interval counter deltas and rates,
    and histogram deltas (non-cumulative bucket counts plus sum and count) for TTFT/ITL/…."""
    out: dict = dict(now.gauges)
    for name, value in now.counters.items():
        d = _delta(value, before.counters.get(name) if before else None)
        out[f"{name}_delta"] = d
        if interval_s > 0 and before is not None:
            out[f"{name}_per_s"] = d / interval_s
    hist_out = {}
    for name, h in now.histograms.items():
        prev = before.histograms.get(name) if before else None
        restarted = prev is None or h.count < prev.count
        buckets = {le: c - (0 if restarted else prev.buckets.get(le, 0.0)) for le, c in h.buckets.items()}
        hist_out[name] = {
            "buckets": buckets,
            "sum": h.sum - (0 if restarted else prev.sum),
            "count": h.count - (0 if restarted else prev.count),
        }
    if hist_out:
        out["histograms"] = hist_out
    return out


def in_flight(sample: Sample) -> int:
    return int(sample.gauges.get("num_running_reqs", 0) + sample.gauges.get("num_queue_reqs", 0))


def mean_from(hist: Mapping) -> float | None:
    return hist["sum"] / hist["count"] if hist.get("count") else None
