"""Files and batches as tenants see them through the OpenAI-compatible API (the edge forwards
``/v1/files`` and ``/v1/batches`` here, having authenticated the key).

Errors are ``BatchApiError``: OpenAI's error shape, with the ``param`` a client's SDK reports.
The worker side (running a batch) is ``controlplane.batches.runner``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.batches.jsonl import ENDPOINTS
from controlplane.batches.storage import object_key
from controlplane.config import Settings
from controlplane.db.types import utcnow
from controlplane.models.batches import Batch, BatchFile
from infra.objectstore import ObjectNotFound, ObjectStore

UPLOAD_PURPOSES = ("batch",)
OUTPUT_PURPOSES = ("batch_output", "batch_error")
COMPLETION_WINDOWS = {"24h": dt.timedelta(hours=24)}
CANCELLABLE = ("validating", "in_progress")
FINAL = ("completed", "failed", "expired", "cancelled")
_FILENAME = re.compile(r"^[^/\\\x00-\x1f]{1,255}$")


@dataclass
class BatchApiError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def _ts(value: dt.datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def file_object(f: BatchFile) -> dict[str, Any]:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": _ts(f.created_at), "filename": f.filename,
            "purpose": f.purpose, "status": "processed", "status_details": None, "expires_at": None}


def batch_object(b: Batch) -> dict[str, Any]:
    return {
        "id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": b.errors, "input_file_id": b.input_file_id,
        "completion_window": b.completion_window, "status": b.status, "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id, "created_at": _ts(b.created_at), "in_progress_at": _ts(b.in_progress_at),
        "expires_at": _ts(b.expires_at), "finalizing_at": _ts(b.finalizing_at), "completed_at": _ts(b.completed_at),
        "failed_at": _ts(b.failed_at), "expired_at": _ts(b.expired_at), "cancelling_at": _ts(b.cancelling_at),
        "cancelled_at": _ts(b.cancelled_at),
        "request_counts": {"total": b.request_total, "completed": b.request_completed, "failed": b.request_failed},
        "metadata": b.batch_metadata,
    }


def page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}


def _limit(raw: str | None, default: int, most: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BatchApiError(400, "limit must be an integer.", "limit", "invalid_value") from None
    if not 1 <= value <= most:
        raise BatchApiError(400, f"limit must be between 1 and {most}.", "limit", "invalid_value")
    return value


# ------------------------------------------------------------------------------------------------
# Files


async def create_file(db: AsyncSession, store: ObjectStore, settings: Settings, tenant_id: uuid.UUID,
                      filename: str | None, purpose: str | None, data: bytes | None) -> dict[str, Any]:
    if purpose not in UPLOAD_PURPOSES:
        raise BatchApiError(400, f"purpose must be one of {', '.join(UPLOAD_PURPOSES)} (got {purpose!r}).",
                            "purpose", "invalid_value")
    if data is None:
        raise BatchApiError(400, "A file is required (multipart field 'file').", "file", "missing_required_parameter")
    if not data:
        raise BatchApiError(400, "The file is empty.", "file", "invalid_value")
    if len(data) > settings.batch_file_max_bytes:
        raise BatchApiError(413, f"The file is {len(data)} bytes; at most {settings.batch_file_max_bytes} are "
                                 "allowed.", "file", "file_too_large")
    name = filename or "upload.jsonl"
    if not _FILENAME.match(name):
        raise BatchApiError(400, "The filename must be 1-255 characters without slashes or control characters.",
                            "file", "invalid_value")
    if not name.endswith(".jsonl"):
        raise BatchApiError(400, "A batch input file must be JSONL (a .jsonl filename).", "file", "invalid_file_format")
    file_id = "file-" + secrets.token_hex(12)
    row = BatchFile(id=file_id, tenant_id=tenant_id, purpose=purpose, filename=name, bytes=len(data),
                    object_key=object_key(tenant_id, file_id))
    # The object first: a row never names bytes that are not there (an orphaned object is only storage).
    await asyncio.to_thread(store.put, row.object_key, data)
    db.add(row)
    await db.flush()
    return file_object(row)


async def _file(db: AsyncSession, tenant_id: uuid.UUID, file_id: str) -> BatchFile:
    row = await db.get(BatchFile, file_id)
    if row is None or row.tenant_id != tenant_id or row.deleted_at is not None:
        raise BatchApiError(404, f"No such File object: {file_id}", "id", "file_not_found")
    return row


async def retrieve_file(db: AsyncSession, tenant_id: uuid.UUID, file_id: str) -> dict[str, Any]:
    return file_object(await _file(db, tenant_id, file_id))


async def file_content(db: AsyncSession, store: ObjectStore, tenant_id: uuid.UUID, file_id: str) -> bytes:
    row = await _file(db, tenant_id, file_id)
    try:
        return await asyncio.to_thread(store.get, row.object_key)
    except ObjectNotFound:
        raise BatchApiError(404, f"The content of {file_id} is gone.", "id", "file_not_found") from None


async def delete_file(db: AsyncSession, store: ObjectStore, tenant_id: uuid.UUID, file_id: str) -> dict[str, Any]:
    row = await _file(db, tenant_id, file_id)
    running = await db.scalar(select(Batch.id).where(Batch.input_file_id == file_id, Batch.status.not_in(FINAL)))
    if running is not None:
        raise BatchApiError(409, f"The file is the input of {running}, which has not finished; cancel it first.",
                            "id", "file_in_use")
    row.deleted_at = utcnow()
    await db.flush()
    await asyncio.to_thread(store.delete, row.object_key)
    return {"id": file_id, "object": "file", "deleted": True}


async def list_files(db: AsyncSession, tenant_id: uuid.UUID, purpose: str | None, limit: str | None,
                     after: str | None, order: str | None) -> dict[str, Any]:
    if order not in (None, "asc", "desc"):
        raise BatchApiError(400, "order must be 'asc' or 'desc'.", "order", "invalid_value")
    most = _limit(limit, 10000, 10000)
    query = select(BatchFile).where(BatchFile.tenant_id == tenant_id, BatchFile.deleted_at.is_(None))
    if purpose:
        query = query.where(BatchFile.purpose == purpose)
    ascending = order == "asc"
    if after:
        cursor = await _file(db, tenant_id, after)
        query = query.where(((BatchFile.created_at > cursor.created_at)
                             | ((BatchFile.created_at == cursor.created_at) & (BatchFile.id > cursor.id))) if ascending
                            else ((BatchFile.created_at < cursor.created_at)
                                  | ((BatchFile.created_at == cursor.created_at) & (BatchFile.id < cursor.id))))
    ordering = (BatchFile.created_at.asc(), BatchFile.id.asc()) if ascending else (
        BatchFile.created_at.desc(), BatchFile.id.desc())
    rows = list(await db.scalars(query.order_by(*ordering).limit(most + 1)))
    return page([file_object(f) for f in rows[:most]], len(rows) > most)


# ------------------------------------------------------------------------------------------------
# Batches


def _metadata(raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > 16 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in raw.items()):
        raise BatchApiError(400, "metadata must be at most 16 string pairs (keys up to 64 characters, values up "
                                 "to 512).", "metadata", "invalid_value")
    return raw


async def create_batch(db: AsyncSession, tenant_id: uuid.UUID, key_id: uuid.UUID, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BatchApiError(400, "The body must be a JSON object.", None, "invalid_json")
    unknown = set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"}
    if unknown:
        name = sorted(unknown)[0]
        raise BatchApiError(400, f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    endpoint, window = body.get("endpoint"), body.get("completion_window")
    if endpoint not in ENDPOINTS:
        raise BatchApiError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}.", "endpoint", "invalid_value")
    if window not in COMPLETION_WINDOWS:
        raise BatchApiError(400, "completion_window must be '24h'.", "completion_window", "invalid_value")
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise BatchApiError(400, "input_file_id is required.", "input_file_id", "missing_required_parameter")
    try:
        source = await _file(db, tenant_id, file_id)
    except BatchApiError:
        raise BatchApiError(404, f"No such File object: {file_id}", "input_file_id", "file_not_found") from None
    if source.purpose != "batch":
        raise BatchApiError(400, f"{file_id} has purpose '{source.purpose}'; a batch's input needs purpose 'batch'.",
                            "input_file_id", "invalid_value")
    now = utcnow()
    row = Batch(id="batch_" + secrets.token_hex(12), tenant_id=tenant_id, key_id=key_id, endpoint=endpoint,
                input_file_id=file_id, completion_window=window, status="validating",
                batch_metadata=_metadata(body.get("metadata")), expires_at=now + COMPLETION_WINDOWS[window],
                request_total=0, request_completed=0, request_failed=0, created_at=now)
    db.add(row)
    await db.flush()
    return batch_object(row)


async def _batch(db: AsyncSession, tenant_id: uuid.UUID, batch_id: str, *, lock: bool = False) -> Batch:
    query = select(Batch).where(Batch.id == batch_id, Batch.tenant_id == tenant_id)
    if lock:
        query = query.with_for_update()
    row = await db.scalar(query)
    if row is None:
        raise BatchApiError(404, f"No such Batch object: {batch_id}", "id", "batch_not_found")
    return row


async def retrieve_batch(db: AsyncSession, tenant_id: uuid.UUID, batch_id: str) -> dict[str, Any]:
    return batch_object(await _batch(db, tenant_id, batch_id))


async def cancel_batch(db: AsyncSession, tenant_id: uuid.UUID, batch_id: str) -> dict[str, Any]:
    """validating / in_progress → cancelling; the runner stops sending lines, keeps what was
    answered and finishes it as cancelled. Cancelling twice is harmless."""
    row = await _batch(db, tenant_id, batch_id, lock=True)
    if row.status in ("cancelling", "cancelled"):
        return batch_object(row)
    if row.status not in CANCELLABLE:
        raise BatchApiError(409, f"Cannot cancel a batch with status '{row.status}'.", "id", "batch_not_cancellable")
    row.status, row.cancelling_at = "cancelling", utcnow()
    await db.flush()
    return batch_object(row)


async def list_batches(db: AsyncSession, tenant_id: uuid.UUID, limit: str | None, after: str | None) -> dict[str, Any]:
    most = _limit(limit, 20, 100)
    query = select(Batch).where(Batch.tenant_id == tenant_id)
    if after:
        cursor = await _batch(db, tenant_id, after)
        query = query.where((Batch.created_at < cursor.created_at)
                            | ((Batch.created_at == cursor.created_at) & (Batch.id < cursor.id)))
    rows = list(await db.scalars(query.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(most + 1)))
    return page([batch_object(b) for b in rows[:most]], len(rows) > most)
