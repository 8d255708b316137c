"""Run batches: every line of a batch's input file through an edge, at batch priority, on the
capacity interactive traffic leaves (the edge keeps a share of every replica's slots for it and
passes the priority to SGLang), then the output and error files.

Crash safety is per line. A batch is claimed with a lease (``fleet.leases``) that the runner
renews while it works; a worker killed mid-batch simply stops renewing, and the next claim
resumes. Answers are recorded in ``batch_results`` keyed by (batch, line), so a line answered
before the kill is skipped, and a line that was in flight is sent again under the same request
id: the edge's usage is deduplicated by request id, so it is metered once and appears once in
the output file. Status moves are written only under the lease's token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import hashlib
import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import httpx
from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from controlplane.batches import jsonl
from controlplane.batches.jsonl import InputLine
from controlplane.batches.storage import batch_store, object_key
from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet.leases import claimable, stamp
from controlplane.models.batches import Batch, BatchFile, BatchResult
from infra.objectstore import ObjectStore

log = logging.getLogger("nimbus.batches")

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
# An answer worth retrying without limit: the tenant's limits or the fleet's capacity say "later".
WAIT_STATUSES = (429, 503)
# Other failures (5xx, no answer) are retried this many times before the line is reported failed.
MAX_ATTEMPTS = 5
BACKOFF_S = (1.0, 30.0)
KEEPER_INTERVAL_S = 1.0


class LeaseLost(Exception):
    """Another worker holds the batch now (ours expired): stop without writing anything more."""


@dataclasses.dataclass(frozen=True)
class Claim:
    batch_id: str
    token: uuid.UUID


@dataclasses.dataclass(frozen=True)
class BatchView:
    """What the runner needs of the row, read once per step."""

    id: str
    tenant_id: uuid.UUID
    key_id: uuid.UUID
    endpoint: str
    status: str
    input_key: str
    expires_at: dt.datetime


def claim_next(settings: Settings, now: dt.datetime | None = None) -> Claim | None:
    now = now or utcnow()
    with session_scope(settings) as db:
        row = db.scalar(claimable(Batch, now, Batch.status.in_(ACTIVE)).order_by(Batch.created_at).limit(1))
        if row is None:
            return None
        return Claim(row.id, stamp([row], now, settings.batch_lease_s))


def _held(db: Session, claim: Claim) -> Batch:
    row = db.scalar(select(Batch).where(Batch.id == claim.batch_id, Batch.lock_token == claim.token).with_for_update())
    if row is None:
        raise LeaseLost(claim.batch_id)
    return row


def _view(settings: Settings, claim: Claim) -> BatchView:
    with session_scope(settings) as db:
        row = _held(db, claim)
        source = db.get(BatchFile, row.input_file_id)
        assert source is not None  # RESTRICT: a batch's input row cannot go
        return BatchView(row.id, row.tenant_id, row.key_id, row.endpoint, row.status, source.object_key,
                         row.expires_at)


def run_batches(settings: Settings, store: ObjectStore | None = None, limit: int | None = None,
                client_factory: Callable[[], httpx.AsyncClient] | None = None) -> int:
    """Claim and run batches until none is left (or ``limit`` ran); returns how many ran."""
    store = store or batch_store(settings)
    ran = 0
    while limit is None or ran < limit:
        claim = claim_next(settings)
        if claim is None:
            break
        try:
            run_batch(settings, store, claim, client_factory)
        except LeaseLost:
            log.warning("batch %s: lease lost to another worker; leaving it", claim.batch_id)
        ran += 1
    return ran


def run_batch(settings: Settings, store: ObjectStore, claim: Claim,
              client_factory: Callable[[], httpx.AsyncClient] | None = None) -> str:
    """Take one claimed batch as far as it goes; returns its final status."""
    view = _view(settings, claim)
    data = store.get(view.input_key)
    lines, problems = jsonl.parse_input(data, view.endpoint, settings.batch_max_requests)
    if view.status == "validating":
        if problems:
            return _fail(settings, claim, problems)
        with session_scope(settings) as db:
            row = _held(db, claim)
            if row.status == "validating":
                row.status, row.in_progress_at, row.request_total = "in_progress", utcnow(), len(lines)
        view = dataclasses.replace(view, status="in_progress")
    elif view.status == "cancelling" and problems:
        return _finish(settings, store, claim, [], "cancelled")
    if view.status == "in_progress":
        done = _answered_lines(settings, claim.batch_id)
        reason = asyncio.run(_send_lines(settings, claim, view, [ln for ln in lines if ln.line not in done],
                                         client_factory))
    else:  # finalizing (a finalize that did not finish) or cancelling
        reason = {"finalizing": "completed", "cancelling": "cancelled"}[view.status]
    return _finish(settings, store, claim, lines, reason)


def _fail(settings: Settings, claim: Claim, problems: list[jsonl.LineError]) -> str:
    with session_scope(settings) as db:
        row = _held(db, claim)
        row.status, row.failed_at = "failed", utcnow()
        row.errors = {"object": "list", "data": [p.as_dict() for p in problems]}
        row.lock_token = row.lock_expires_at = None
    return "failed"


def _answered_lines(settings: Settings, batch_id: str) -> set[int]:
    with session_scope(settings) as db:
        return set(db.scalars(select(BatchResult.line).where(BatchResult.batch_id == batch_id)))


# ------------------------------------------------------------------------------------------------
# Sending


def edge_client(settings: Settings) -> httpx.AsyncClient:
    conc = settings.batch_concurrency
    return httpx.AsyncClient(base_url=settings.batch_edge_url or settings.edge_url,
                             timeout=httpx.Timeout(900.0, connect=10.0),
                             limits=httpx.Limits(max_connections=conc, max_keepalive_connections=conc))


def _retry_after(response: httpx.Response, fallback: float) -> float:
    try:
        return min(BACKOFF_S[1], max(0.1, float(response.headers.get("retry-after", fallback))))
    except ValueError:
        return fallback


async def _send_lines(settings: Settings, claim: Claim, view: BatchView, pending: list[InputLine],
                      client_factory: Callable[[], httpx.AsyncClient] | None) -> str:
    """Send ``pending`` with ``batch_concurrency`` in flight, record answers as they come; returns
    why it stopped: completed (every line answered), cancelled, expired. Raises LeaseLost."""
    stop = asyncio.Event()
    outcome = {"reason": "completed"}
    results: list[tuple[InputLine, bool, str]] = []
    todo = iter(pending)
    headers = {"authorization": f"Bearer {settings.edge_token.get_secret_value()}",
               "x-nimbus-on-behalf-of": str(view.key_id), "content-type": "application/json"}

    async def pause(seconds: float) -> None:
        try:
            await asyncio.wait_for(stop.wait(), seconds)
        except TimeoutError:
            pass

    async def send(client: httpx.AsyncClient, item: InputLine) -> tuple[bool, str] | None:
        body = {k: v for k, v in item.body.items() if k not in ("stream", "stream_options")}
        rid = jsonl.request_id(view.id, item.line)
        failures, delay = 0, BACKOFF_S[0]
        while not stop.is_set():
            try:
                response = await client.post(view.endpoint, json=body, headers={**headers, "x-nimbus-request-id": rid})
            except httpx.TransportError as exc:
                failures += 1
                if failures >= MAX_ATTEMPTS:
                    return False, jsonl.unanswered(view.id, item, "server_error",
                                                   f"No answer from the edge after {failures} attempts "
                                                   f"({type(exc).__name__}).")
                await pause(delay)
                delay = min(BACKOFF_S[1], delay * 2)
                continue
            status = response.status_code
            retry = status in WAIT_STATUSES or (status >= 500 and failures + 1 < MAX_ATTEMPTS)
            if retry:
                failures += status not in WAIT_STATUSES
                await pause(_retry_after(response, delay))
                delay = min(BACKOFF_S[1], delay * 2)
                continue
            try:
                answer: Any = response.json()
            except ValueError:
                answer = response.text
            return response.is_success, jsonl.answered(view.id, item, status, answer)
        return None  # stopped (cancel, expiry, lost lease): the line stays unanswered

    async def worker(client: httpx.AsyncClient) -> None:
        for item in todo:
            if stop.is_set():
                return
            answer = await send(client, item)
            if answer is not None:
                results.append((item, *answer))

    async def keeper() -> None:
        while True:
            await pause(KEEPER_INTERVAL_S)
            batch, results[:] = list(results), []
            try:
                status, expires_at = await asyncio.to_thread(_record, settings, claim, batch)
            except LeaseLost:
                outcome["reason"] = "lost"
                stop.set()
                return
            if status == "cancelling":
                outcome["reason"] = "cancelled"
                stop.set()
            elif utcnow() >= expires_at:
                outcome["reason"] = "expired"
                stop.set()
            if stop.is_set():
                return

    async with (client_factory or (lambda: edge_client(settings)))() as client:
        keeping = asyncio.create_task(keeper())
        await asyncio.gather(*(worker(client) for _ in range(max(1, min(settings.batch_concurrency, len(pending))))))
        stop.set()
        await keeping
    if outcome["reason"] == "lost":
        raise LeaseLost(claim.batch_id)
    await asyncio.to_thread(_record, settings, claim, results)  # what came in after the keeper's last round
    return outcome["reason"]


def _insert_results(db: Session, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    insert = pg_insert if db.get_bind().dialect.name == "postgresql" else sqlite_insert
    db.execute(insert(BatchResult).values(rows).on_conflict_do_nothing(index_elements=["batch_id", "line"]))


def _record(settings: Settings, claim: Claim, results: Iterable[tuple[InputLine, bool, str]]) -> tuple[str, dt.datetime]:
    """Write answers (a line already answered keeps its first answer), refresh the counts, renew
    the lease; returns the batch's status and expiry as the tenant may have changed them."""
    now = utcnow()
    with session_scope(settings) as db:
        row = _held(db, claim)
        rows = [{"batch_id": claim.batch_id, "line": item.line, "custom_id": item.custom_id, "ok": ok, "record": rec,
                 "created_at": now} for item, ok, rec in results]
        for start in range(0, len(rows), 1000):
            _insert_results(db, rows[start:start + 1000])
        counts = dict(db.execute(select(BatchResult.ok, func.count()).where(BatchResult.batch_id == claim.batch_id)
                                 .group_by(BatchResult.ok)).all())
        row.request_completed, row.request_failed = counts.get(True, 0), counts.get(False, 0)
        row.lock_expires_at = now + dt.timedelta(seconds=settings.batch_lease_s)
        return row.status, row.expires_at


# ------------------------------------------------------------------------------------------------
# Finishing


def result_file_id(batch_id: str, kind: str) -> str:
    """Deterministic, so a finalize repeated after a crash writes the same files, not new ones."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


def _finish(settings: Settings, store: ObjectStore, claim: Claim, lines: list[InputLine], reason: str) -> str:
    """Write the output and error files and move the batch to its final status."""
    now = utcnow()
    with session_scope(settings) as db:
        row = _held(db, claim)
        if reason == "completed" and row.status == "in_progress":
            row.status, row.finalizing_at = "finalizing", now
        if reason == "expired":
            answered = set(db.scalars(select(BatchResult.line).where(BatchResult.batch_id == claim.batch_id)))
            _insert_results(db, [{"batch_id": claim.batch_id, "line": ln.line, "custom_id": ln.custom_id, "ok": False,
                                  "record": jsonl.unanswered(claim.batch_id, ln, "batch_expired",
                                                             "This request could not be executed before the "
                                                             "completion window expired."),
                                  "created_at": now} for ln in lines if ln.line not in answered])
        tenant_id = row.tenant_id
        records = db.execute(select(BatchResult.ok, BatchResult.record).where(BatchResult.batch_id == claim.batch_id)
                             .order_by(BatchResult.line)).all()
    files: dict[str, tuple[str, bytes]] = {}
    for kind, ok in (("output", True), ("error", False)):
        body = "".join(rec + "\n" for good, rec in records if good == ok).encode()
        if body:
            file_id = result_file_id(claim.batch_id, kind)
            store.put(object_key(tenant_id, file_id), body)
            files[kind] = (file_id, body)
    with session_scope(settings) as db:
        row = _held(db, claim)
        for kind, (file_id, body) in files.items():
            if db.get(BatchFile, file_id) is None:
                db.add(BatchFile(id=file_id, tenant_id=tenant_id, purpose=f"batch_{kind}",
                                 filename=f"{claim.batch_id}_{kind}.jsonl", bytes=len(body),
                                 object_key=object_key(tenant_id, file_id)))
        row.output_file_id = files.get("output", (None,))[0]
        row.error_file_id = files.get("error", (None,))[0]
        ok = sum(1 for good, _ in records if good)
        row.request_completed, row.request_failed = ok, len(records) - ok
        final = {"completed": "completed", "cancelled": "cancelled", "expired": "expired"}[reason]
        row.status = final
        setattr(row, f"{final}_at", utcnow())
        row.lock_token = row.lock_expires_at = None
        db.flush()
        db.execute(delete(BatchResult).where(BatchResult.batch_id == claim.batch_id))
    log.info("batch %s %s: %d answered, %d failed", claim.batch_id, final, ok, len(records) - ok)
    return final
