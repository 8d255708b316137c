from __future__ import annotations

import datetime as dt
import uuid
from typing import Literal

import msgspec

Granularity = Literal["minute", "hour", "day", "total"]


class UsageNumbers(msgspec.Struct):
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cached_responses: int = 0  # requests answered from the response cache (no GPU tokens)
    avg_queue_ms: float | None = None
    avg_ttft_ms: float | None = None
    avg_duration_ms: float | None = None
    cache_hit_rate: float | None = None


class UsageBucket(msgspec.Struct):
    start: dt.datetime
    usage: UsageNumbers


class UsageSeries(msgspec.Struct):
    variant_id: uuid.UUID
    model: str
    tier: str
    total: UsageNumbers
    buckets: list[UsageBucket]


class UsageReport(msgspec.Struct):
    start: dt.datetime
    end: dt.datetime
    granularity: str
    total: UsageNumbers
    series: list[UsageSeries]


class TenantModelOut(msgspec.Struct):
    name: str
    display_name: str
    default_tier: str | None
    tiers: list[str]
    context_length: int
    ready_replicas: int
    dedicated: bool
