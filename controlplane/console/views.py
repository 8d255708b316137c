"""Read compositions for console pages. Business rules stay in controlplane.services; this module
only gathers what a page shows. Tenant reads are scoped by the tenant id (catalog_views'
visible_pools predicate); operator reads use the fleet services."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.console import metrics
from controlplane.db.types import utcnow
from controlplane.models import Model, ModelVariant, Node, Pool, Replica
from controlplane.schemas.fleet import DecisionOut, NodeOut, OperationOut, PoolOut, ReplicaOut
from controlplane.schemas.usage import TenantModelOut, UsageNumbers
from controlplane.services import catalog_views, fleet, pools, tenants, usage
from controlplane.services.errors import NotFound

LIVE_REPLICA_STATES = ("starting", "ready", "draining")


# ---------------------------------------------------------------- tenant
async def visible_model(db: AsyncSession, tenant_id: uuid.UUID, name: str) -> TenantModelOut:
    """A model this tenant may use; any other name is 'not found', exactly like one that does not exist."""
    for m in await catalog_views.models_for_tenant(db, tenant_id):
        if m.name == name:
            return m
    raise NotFound("model", name)


async def cold_starts(db: AsyncSession, tenant_id: uuid.UUID) -> dict[tuple[str, str], tuple[float, dict[str, float]]]:
    """Mean model-ready time (and its parts) per (model, tier), over replicas of pools this tenant can use."""
    rows = await db.execute(
        select(Model.name, ModelVariant.tier, Replica.model_ready_seconds, Replica.ready_breakdown)
        .join(Pool, Pool.id == Replica.pool_id)
        .join(ModelVariant, ModelVariant.id == Replica.variant_id)
        .join(Model, Model.id == ModelVariant.model_id)
        .where(catalog_views.visible_pools(tenant_id), Replica.model_ready_seconds.is_not(None))
    )
    acc: dict[tuple[str, str], list] = defaultdict(lambda: [0.0, 0, defaultdict(float)])
    for name, tier, seconds, parts in rows:
        a = acc[(name, tier)]
        a[0] += seconds
        a[1] += 1
        for part, value in (parts or {}).items():
            if isinstance(value, int | float):
                a[2][part] += value
    return {k: (total / n, {p: v / n for p, v in parts.items()}) for k, (total, n, parts) in acc.items()}


async def latency_breakdowns(db: AsyncSession, tenant_id: uuid.UUID, *, since: dt.timedelta,
                             model: str | None = None) -> list[metrics.Breakdown]:
    end = utcnow()
    report = await usage.report(db, tenant_id, start=end - since, end=end, granularity="total", model=model)
    cold = await cold_starts(db, tenant_id)
    seen = set()
    out = []
    for s in report.series:
        seen.add((s.model, s.tier))
        seconds, parts = cold.get((s.model, s.tier), (None, {}))
        out.append(metrics.breakdown(s.model, s.tier, s.total, seconds, parts))
    # Variants with replicas but no traffic yet still have a cold-start time worth showing.
    for (name, tier), (seconds, parts) in sorted(cold.items()):
        if (name, tier) not in seen and (model is None or name == model):
            out.append(metrics.breakdown(name, tier, UsageNumbers(), seconds, parts))
    return out


# ---------------------------------------------------------------- operator
@dataclass(frozen=True)
class PoolRow:
    pool: PoolOut
    replicas: list[ReplicaOut]
    gpus_in_use: int
    kv_use: float | None  # mean KV-cache occupancy (token_usage) of live replicas, 0..1
    running: int
    queued: int


def summarize_pool(pool: PoolOut, replicas: list[ReplicaOut]) -> PoolRow:
    live = [r for r in replicas if r.state in LIVE_REPLICA_STATES]
    kv = [float(r.metrics["token_usage"]) for r in live if isinstance(r.metrics.get("token_usage"), int | float)]
    return PoolRow(
        pool=pool, replicas=replicas, gpus_in_use=sum(len(r.gpu_ids) for r in live),
        kv_use=sum(kv) / len(kv) if kv else None,
        running=sum(int(r.metrics.get("num_running_reqs") or 0) for r in live),
        queued=sum(int(r.metrics.get("num_queue_reqs") or 0) for r in live),
    )


async def pool_rows(db: AsyncSession, *, limit: int = 500) -> list[PoolRow]:
    rows, _ = await pools.list_pools(db, variant_id=None, tenant_id=None, limit=limit, offset=0)
    by_state = await pools.replicas_by_state(db, [p.id for p in rows])
    replicas, _ = await fleet.list_replicas(db, pool_id=None, node_id=None, state=None, limit=5000, offset=0)
    per_pool: dict[uuid.UUID, list[ReplicaOut]] = defaultdict(list)
    for r in replicas:
        per_pool[r.pool_id].append(fleet.replica_out(r))
    return [summarize_pool(pools.pool_out(p, by_state[p.id]), per_pool[p.id]) for p in rows]


async def pool_detail(db: AsyncSession, pool_id: uuid.UUID) -> tuple[PoolRow, list[DecisionOut], list[OperationOut]]:
    pool = await pools.get(db, pool_id)
    by_state = await pools.replicas_by_state(db, [pool.id])
    replicas, _ = await fleet.list_replicas(db, pool_id=pool.id, node_id=None, state=None, limit=1000, offset=0)
    decisions, _ = await fleet.list_decisions(db, pool_id=pool.id, limit=50, offset=0)
    ops, _ = await fleet.list_operations(db, pool_id=pool.id, node_id=None, state=None, limit=50, offset=0)
    row = summarize_pool(pools.pool_out(pool, by_state[pool.id]), [fleet.replica_out(r) for r in replicas])
    return row, [fleet.decision_out(d) for d in decisions], [fleet.operation_out(o) for o in ops]


async def recent_decisions(db: AsyncSession, pool_ids: list[uuid.UUID], per_pool: int = 5) -> list[DecisionOut]:
    out: list[DecisionOut] = []
    for pid in pool_ids:
        rows, _ = await fleet.list_decisions(db, pool_id=pid, limit=per_pool, offset=0)
        out.extend(fleet.decision_out(d) for d in rows)
    return sorted(out, key=lambda d: d.created_at, reverse=True)


@dataclass(frozen=True)
class RestartNote:
    """A replica's last engine restart, as its agent reported it (the reason is agent text: the
    control plane stored it cleaned, the templates escape it)."""

    at: dt.datetime | None
    reason: str | None
    exit_code: int | None
    restarts: int

    @property
    def text(self) -> str:
        when = ""
        if self.at is not None:
            when = " " + self.at.strftime("%H:%M" if self.at.date() == utcnow().date() else "%Y-%m-%d %H:%M")
        why = self.reason or (f"exit code {self.exit_code}" if self.exit_code is not None else "no reason reported")
        return f"restarted{when}: {why}"


def _parse_at(value: object) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return at.astimezone(dt.UTC) if at.tzinfo else at.replace(tzinfo=dt.UTC)


def _note(entry: Mapping) -> RestartNote:
    reason = entry.get("reason")
    code = entry.get("exit_code")
    restarts = entry.get("restarts")
    return RestartNote(at=_parse_at(entry.get("at")), reason=reason if isinstance(reason, str) and reason else None,
                       exit_code=code if isinstance(code, int) else None,
                       restarts=restarts if isinstance(restarts, int) else 0)


def restart_notes(node_metrics: Iterable[Mapping | None]) -> dict[str, RestartNote]:
    """Replica id -> its last restart, from nodes' stored health (``health.replica_restarts``, and
    for rows written before it, ``health.last_restart`` / the agent's ``agent.last_restart``)."""
    out: dict[str, RestartNote] = {}
    for m in node_metrics:
        if not isinstance(m, Mapping):
            continue
        health = m.get("health") if isinstance(m.get("health"), Mapping) else {}
        agent = m.get("agent") if isinstance(m.get("agent"), Mapping) else {}
        for last in (agent.get("last_restart"), health.get("last_restart")):  # the per-replica map wins
            rid = last.get("replica_id") if isinstance(last, Mapping) else None
            if isinstance(rid, str):
                note = _note(last)
                if rid not in out or (note.reason and not out[rid].reason):
                    out[rid] = note
        per_replica = health.get("replica_restarts")
        if isinstance(per_replica, Mapping):
            for rid, entry in per_replica.items():
                if isinstance(entry, Mapping):
                    out[str(rid)] = _note(entry)
    return out


async def replica_restarts(db: AsyncSession, node_ids: Iterable[uuid.UUID]) -> dict[str, RestartNote]:
    ids = set(node_ids)
    if not ids:
        return {}
    return restart_notes((await db.scalars(select(Node.metrics).where(Node.id.in_(ids)))).all())


async def nodes(db: AsyncSession, limit: int = 500) -> list[NodeOut]:
    rows, _ = await fleet.list_nodes(db, pool_id=None, state=None, limit=limit, offset=0)
    return [fleet.node_out(n) for n in rows]


async def operations(db: AsyncSession, limit: int = 100) -> list[OperationOut]:
    rows, _ = await fleet.list_operations(db, pool_id=None, node_id=None, state=None, limit=limit, offset=0)
    return [fleet.operation_out(o) for o in rows]


async def tenant_rows(db: AsyncSession, limit: int = 500):
    rows, total = await tenants.list_tenants(db, status=None, name=None, limit=limit, offset=0)
    return [tenants.tenant_out(t) for t in rows], total
