"""The OpenAI Files and Batches API behind the edge (``/internal/v1/openai``).

Tenants call ``/v1/files`` and ``/v1/batches`` on an edge, which authenticates their key against
its snapshot (the one place keys are checked for the OpenAI API) and forwards the call here with
the edge token and the key's tenant and id. Answers and errors are OpenAI's shapes, passed back
verbatim. The routes stay thin: ``controlplane.services.batches`` does the work.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.datastructures import State, UploadFile
from litestar.di import Provide
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.internal import edge_guard
from controlplane.batches.storage import batch_store
from controlplane.services import batches as svc
from controlplane.services.batches import BatchApiError


class Caller(msgspec.Struct, frozen=True):
    tenant_id: uuid.UUID
    key_id: uuid.UUID


async def provide_caller(request: Request) -> Caller:
    try:
        return Caller(uuid.UUID(request.headers["x-nimbus-tenant-id"]), uuid.UUID(request.headers["x-nimbus-key-id"]))
    except (KeyError, ValueError):
        raise BatchApiError(400, "The edge must name the caller's tenant and key.", None, "invalid_request") from None


def openai_error(_request: Request, exc: BatchApiError) -> Response:
    return Response(content=exc.body(), status_code=exc.status, media_type="application/json")


def _json(content: Any, status: int = 200) -> Response:
    return Response(content=content, status_code=status, media_type="application/json")


class BatchApiController(Controller):
    path = "/internal/v1/openai"
    tags = ["internal"]
    guards = [edge_guard]
    dependencies = {"caller": Provide(provide_caller)}
    exception_handlers = {BatchApiError: openai_error}
    include_in_schema = False

    # The edge bounds what it forwards; the service checks the configured limit on the bytes.
    @post("/files", request_max_body_size=1 << 30)
    async def create_file(self, request: Request, state: State, db: AsyncSession, caller: Caller) -> Response:
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise BatchApiError(415, "Upload files as multipart/form-data (fields 'file' and 'purpose').", None,
                                "unsupported_media_type")
        form = await request.form()
        upload = form.get("file")
        data = filename = None
        if isinstance(upload, UploadFile):
            data, filename = await upload.read(), upload.filename
        purpose = form.get("purpose")
        return _json(await svc.create_file(db, batch_store(state.settings), state.settings, caller.tenant_id,
                                           filename, purpose if isinstance(purpose, str) else None, data))

    @get("/files")
    async def list_files(self, request: Request, db: AsyncSession, caller: Caller) -> Response:
        q = request.query_params
        return _json(await svc.list_files(db, caller.tenant_id, q.get("purpose"), q.get("limit"), q.get("after"),
                                          q.get("order")))

    @get("/files/{file_id:str}")
    async def retrieve_file(self, db: AsyncSession, caller: Caller, file_id: str) -> Response:
        return _json(await svc.retrieve_file(db, caller.tenant_id, file_id))

    @get("/files/{file_id:str}/content")
    async def file_content(self, state: State, db: AsyncSession, caller: Caller, file_id: str) -> Response:
        data = await svc.file_content(db, batch_store(state.settings), caller.tenant_id, file_id)
        return Response(content=data, media_type="application/octet-stream")

    @delete("/files/{file_id:str}", status_code=200)
    async def delete_file(self, state: State, db: AsyncSession, caller: Caller, file_id: str) -> Response:
        return _json(await svc.delete_file(db, batch_store(state.settings), caller.tenant_id, file_id))

    @post("/batches")
    async def create_batch(self, request: Request, db: AsyncSession, caller: Caller) -> Response:
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError:
            raise BatchApiError(400, "The body is not valid JSON.", None, "invalid_json") from None
        return _json(await svc.create_batch(db, caller.tenant_id, caller.key_id, body))

    @get("/batches")
    async def list_batches(self, request: Request, db: AsyncSession, caller: Caller) -> Response:
        q = request.query_params
        return _json(await svc.list_batches(db, caller.tenant_id, q.get("limit"), q.get("after")))

    @get("/batches/{batch_id:str}")
    async def retrieve_batch(self, db: AsyncSession, caller: Caller, batch_id: str) -> Response:
        return _json(await svc.retrieve_batch(db, caller.tenant_id, batch_id))

    @post("/batches/{batch_id:str}/cancel")
    async def cancel_batch(self, db: AsyncSession, caller: Caller, batch_id: str) -> Response:
        return _json(await svc.cancel_batch(db, caller.tenant_id, batch_id))
