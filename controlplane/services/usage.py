"""Usage: exactly-once ingestion of edge events into minute buckets, and tenant-scoped reports."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from controlplane.models import Model, ModelVariant, UsageEventSeen, UsageMinute
from controlplane.schemas.usage import UsageBucket, UsageNumbers, UsageReport, UsageSeries
from controlplane.services.errors import FieldError, Invalid

_SUM_COLUMNS = (
    "requests", "errors", "prompt_tokens", "completion_tokens", "cached_tokens", "cached_responses",
    "queue_ms_sum", "ttft_ms_sum", "duration_ms_sum",
)
MAX_REPORT_BUCKETS = 20_000


# ---------------------------------------------------------------- ingestion (Celery side)
def _minute(ts: float) -> dt.datetime:
    t = dt.datetime.fromtimestamp(float(ts), dt.UTC)
    return t.replace(second=0, microsecond=0)


def _int(event: Mapping[str, str], key: str) -> int:
    try:
        return max(0, int(float(event.get(key) or 0)))
    except ValueError:
        return 0


def aggregate(events: Iterable[Mapping[str, str]]) -> dict[tuple[uuid.UUID, uuid.UUID, dt.datetime], dict[str, int]]:
    """Pure: sum events into (tenant, variant, minute) buckets. Events lacking ids are skipped by
    the caller (they are still acknowledged and logged), never half-counted."""
    buckets: dict[tuple, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_SUM_COLUMNS, 0))
    for e in events:
        b = buckets[(uuid.UUID(e["tenant_id"]), uuid.UUID(e["variant_id"]), _minute(e["ts"]))]
        b["requests"] += 1
        b["errors"] += 0 if e.get("status") == "ok" else 1
        b["prompt_tokens"] += _int(e, "prompt_tokens")
        b["completion_tokens"] += _int(e, "completion_tokens")
        b["cached_tokens"] += _int(e, "cached_tokens")
        b["cached_responses"] += 1 if e.get("cache") in ("hit", "semantic") else 0
        b["queue_ms_sum"] += _int(e, "queue_ms")
        b["ttft_ms_sum"] += _int(e, "ttft_ms")
        b["duration_ms_sum"] += _int(e, "duration_ms")
    return buckets


def is_countable(event: Mapping[str, str]) -> bool:
    try:
        uuid.UUID(event["tenant_id"])
        uuid.UUID(event["variant_id"])
        float(event["ts"])
        return bool(event["request_id"])
    except (KeyError, ValueError, TypeError):
        return False


def ingest(session: Session, events: list[Mapping[str, str]]) -> int:
    """Adds events to the minute buckets exactly once (by request_id). Returns how many were new.

    The seen-ledger insert and the bucket upserts share one transaction, so a crash before
    commit counts nothing and the redelivered batch counts everything once.
    """
    events = [e for e in events if is_countable(e)]
    if not events:
        return 0
    ids = list({e["request_id"] for e in events})
    seen = set(session.scalars(select(UsageEventSeen.request_id).where(UsageEventSeen.request_id.in_(ids))))
    fresh: dict[str, Mapping[str, str]] = {}
    for e in events:
        if e["request_id"] not in seen and e["request_id"] not in fresh:
            fresh[e["request_id"]] = e
    if not fresh:
        return 0
    session.add_all(UsageEventSeen(request_id=rid) for rid in fresh)
    for (tenant_id, variant_id, minute), sums in aggregate(fresh.values()).items():
        row = session.get(UsageMinute, (tenant_id, variant_id, minute), with_for_update=True)
        if row is None:
            session.add(UsageMinute(tenant_id=tenant_id, variant_id=variant_id, minute=minute, **sums))
        else:
            for k, v in sums.items():
                setattr(row, k, getattr(row, k) + v)
    session.flush()
    return len(fresh)


# ---------------------------------------------------------------- reports (API side)
def _numbers(s: Mapping[str, int]) -> UsageNumbers:
    n = s["requests"] or 0
    prompt = s["prompt_tokens"] or 0
    return UsageNumbers(
        requests=n,
        errors=s["errors"] or 0,
        prompt_tokens=prompt,
        completion_tokens=s["completion_tokens"] or 0,
        cached_tokens=s["cached_tokens"] or 0,
        cached_responses=s["cached_responses"] or 0,
        avg_queue_ms=(s["queue_ms_sum"] or 0) / n if n else None,
        avg_ttft_ms=(s["ttft_ms_sum"] or 0) / n if n else None,
        avg_duration_ms=(s["duration_ms_sum"] or 0) / n if n else None,
        cache_hit_rate=(s["cached_tokens"] or 0) / prompt if prompt else None,
    )


def _truncate(minute: dt.datetime, granularity: str, start: dt.datetime) -> dt.datetime:
    if granularity == "hour":
        return minute.replace(minute=0)
    if granularity == "day":
        return minute.replace(hour=0, minute=0)
    if granularity == "total":
        return start
    return minute


async def report(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    start: dt.datetime,
    end: dt.datetime,
    granularity: str,
    model: str | None = None,
) -> UsageReport:
    for name, value in (("start", start), ("end", end)):
        if value.tzinfo is None:
            raise Invalid(f"{name} needs a time zone", [FieldError(name, "must include a UTC offset")])
    if end <= start:
        raise Invalid("end must be after start", [FieldError("end", "must be after start")])
    per_bucket = {"minute": 60, "hour": 3600, "day": 86400}.get(granularity)
    if per_bucket and (end - start).total_seconds() / per_bucket > MAX_REPORT_BUCKETS:
        raise Invalid("range too long for this granularity", [FieldError("granularity", "use a coarser one")])
    # Minute rows are grouped in SQL; coarser buckets are folded here, which keeps the query
    # portable across Postgres and SQLite without per-dialect date functions.
    stmt = (
        select(
            UsageMinute.variant_id,
            UsageMinute.minute,
            *[func.sum(getattr(UsageMinute, c)).label(c) for c in _SUM_COLUMNS],
        )
        .where(UsageMinute.tenant_id == tenant_id, UsageMinute.minute >= start, UsageMinute.minute < end)
        .group_by(UsageMinute.variant_id, UsageMinute.minute)
    )
    if model:
        stmt = stmt.join(ModelVariant, ModelVariant.id == UsageMinute.variant_id).join(Model).where(Model.name == model)
    rows = (await session.execute(stmt)).mappings().all()
    by_variant: dict[uuid.UUID, dict[dt.datetime, dict[str, int]]] = defaultdict(dict)
    for r in rows:
        bucket = _truncate(r["minute"], granularity, start)
        acc = by_variant[r["variant_id"]].setdefault(bucket, dict.fromkeys(_SUM_COLUMNS, 0))
        for c in _SUM_COLUMNS:
            acc[c] += int(r[c] or 0)
    names = {}
    if by_variant:
        for vid, tier, mname in await session.execute(
            select(ModelVariant.id, ModelVariant.tier, Model.name).join(Model).where(ModelVariant.id.in_(by_variant))
        ):
            names[vid] = (mname, tier)
    grand = dict.fromkeys(_SUM_COLUMNS, 0)
    series = []
    for vid, buckets in by_variant.items():
        vtotal = dict.fromkeys(_SUM_COLUMNS, 0)
        for sums in buckets.values():
            for c in _SUM_COLUMNS:
                vtotal[c] += sums[c]
                grand[c] += sums[c]
        mname, tier = names.get(vid, ("(deleted)", ""))
        series.append(
            UsageSeries(
                variant_id=vid, model=mname, tier=tier, total=_numbers(vtotal),
                buckets=[UsageBucket(start=k, usage=_numbers(v)) for k, v in sorted(buckets.items())],
            )
        )
    series.sort(key=lambda s: (s.model, s.tier))
    return UsageReport(start=start, end=end, granularity=granularity, total=_numbers(grand), series=series)


def month_to_date_tokens(session: Session, now: dt.datetime) -> dict[uuid.UUID, int]:
    """Tokens (prompt + completion) each tenant used this calendar month: budgets in the edge snapshot."""
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    rows = session.execute(
        select(UsageMinute.tenant_id, func.sum(UsageMinute.prompt_tokens + UsageMinute.completion_tokens))
        .where(UsageMinute.minute >= month_start)
        .group_by(UsageMinute.tenant_id)
    )
    return {tid: int(total or 0) for tid, total in rows}
