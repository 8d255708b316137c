"""Pure functions that turn a usage report into what the console shows: time series for the
dashboard, the per-model latency breakdown and the CSV export. No I/O here."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable
from dataclasses import dataclass, field

from controlplane.schemas.usage import UsageNumbers, UsageReport

# name -> (window, display bucket). Minute rows are fetched and folded into display buckets.
RANGES: dict[str, tuple[dt.timedelta, dt.timedelta]] = {
    "1h": (dt.timedelta(hours=1), dt.timedelta(minutes=1)),
    "24h": (dt.timedelta(days=1), dt.timedelta(hours=1)),
    "7d": (dt.timedelta(days=7), dt.timedelta(days=1)),
}
DEFAULT_RANGE = "24h"


def window(range_name: str, now: dt.datetime) -> tuple[dt.datetime, dt.datetime, dt.timedelta]:
    """(start, end, step) with end at the next bucket boundary, so the current bucket is complete."""
    span, step = RANGES.get(range_name, RANGES[DEFAULT_RANGE])
    epoch = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    end = epoch + ((now - epoch) // step + 1) * step
    return end - span, end, step


def weighted_percentile(samples: Iterable[tuple[float, int]], q: float) -> float | None:
    """Nearest-rank percentile of (value, weight) pairs, e.g. per-minute mean TTFT weighted by requests."""
    pairs = sorted((v, w) for v, w in samples if w > 0)
    total = sum(w for _, w in pairs)
    if not total:
        return None
    rank = q * total
    seen = 0
    for value, weight in pairs:
        seen += weight
        if seen >= rank:
            return value
    return pairs[-1][0]


@dataclass
class Point:
    start: dt.datetime
    requests: int = 0
    errors: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_samples: list[tuple[float, int]] = field(default_factory=list)

    @property
    def cache_hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def ttft_p50(self) -> float | None:
        return weighted_percentile(self.ttft_samples, 0.50)

    @property
    def ttft_p95(self) -> float | None:
        return weighted_percentile(self.ttft_samples, 0.95)


def timeline(report: UsageReport, start: dt.datetime, end: dt.datetime, step: dt.timedelta) -> list[Point]:
    """Every display bucket from start to end (empty ones included, so gaps show as zero)."""
    points: list[Point] = []
    t = start
    while t < end:
        points.append(Point(start=t))
        t += step
    for series in report.series:
        for bucket in series.buckets:
            index = int((bucket.start - start) // step)
            if not 0 <= index < len(points):
                continue
            p, u = points[index], bucket.usage
            p.requests += u.requests
            p.errors += u.errors
            p.tokens += u.prompt_tokens + u.completion_tokens
            p.prompt_tokens += u.prompt_tokens
            p.cached_tokens += u.cached_tokens
            if u.avg_ttft_ms is not None and u.requests:
                p.ttft_samples.append((u.avg_ttft_ms, u.requests))
    return points


def overall_ttft(points: list[Point], q: float) -> float | None:
    return weighted_percentile((s for p in points for s in p.ttft_samples), q)


@dataclass(frozen=True)
class Breakdown:
    """Where a request's time goes, in milliseconds (means over the window)."""

    model: str
    tier: str
    requests: int
    queue_ms: float | None
    prefill_ms: float | None  # first token minus queueing: the engine's prefill, network included
    generation_ms: float | None  # last token minus first token
    cold_start_s: float | None  # mean model-ready time of the replicas serving this variant
    cold_start_parts: dict[str, float]


def breakdown(model: str, tier: str, total: UsageNumbers, cold_start_s: float | None,
              cold_start_parts: dict[str, float]) -> Breakdown:
    queue, ttft, duration = total.avg_queue_ms, total.avg_ttft_ms, total.avg_duration_ms
    return Breakdown(
        model=model, tier=tier, requests=total.requests, queue_ms=queue,
        prefill_ms=max(ttft - (queue or 0.0), 0.0) if ttft is not None else None,
        generation_ms=max(duration - ttft, 0.0) if duration is not None and ttft is not None else None,
        cold_start_s=cold_start_s, cold_start_parts=cold_start_parts,
    )


CSV_COLUMNS = ("bucket_start", "model", "tier", "requests", "errors", "prompt_tokens", "completion_tokens",
               "cached_tokens", "cached_responses", "avg_queue_ms", "avg_ttft_ms", "avg_duration_ms", "cache_hit_rate")


def usage_rows(report: UsageReport) -> list[dict[str, object]]:
    rows = []
    for s in report.series:
        for b in s.buckets:
            u = b.usage
            rows.append({
                "bucket_start": b.start.isoformat(), "model": s.model, "tier": s.tier, "requests": u.requests,
                "errors": u.errors, "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "cached_tokens": u.cached_tokens, "cached_responses": u.cached_responses, "avg_queue_ms": _round(u.avg_queue_ms),
                "avg_ttft_ms": _round(u.avg_ttft_ms), "avg_duration_ms": _round(u.avg_duration_ms),
                "cache_hit_rate": _round(u.cache_hit_rate, 4),
            })
    rows.sort(key=lambda r: (r["bucket_start"], r["model"], r["tier"]))
    return rows


def to_csv(rows: list[dict[str, object]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        # A model name starting with = + - @ would run as a formula in a spreadsheet.
        writer.writerow({k: _defuse(v) for k, v in row.items()})
    return out.getvalue()


def _defuse(value: object) -> object:
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return "" if value is None else value


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)
