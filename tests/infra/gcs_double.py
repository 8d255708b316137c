"""GCS JSON API **test double**: a small ASGI app, served on a loopback port by
:func:`tests.live_server.serve`, speaking the slice of the Cloud Storage JSON API that
``google-cloud-storage`` uses for ``infra.objectstore.GCSStore``. Google Cloud Storage
cannot run here, so the real client library is pointed at this instead
(``client_options={"api_endpoint": ...}``, anonymous credentials).

Implemented:

- uploads: ``POST /upload/storage/v1/b/{bucket}/o`` with ``uploadType=multipart`` (JSON
  metadata part + media part; a ``crc32c``/``md5Hash`` in the metadata is verified),
  ``uploadType=media`` (``name`` in the query), and ``uploadType=resumable`` (the POST
  opens a session whose URL comes back in ``Location``; ``PUT`` chunks with
  ``Content-Range``; ``308`` plus ``Range`` until the last byte, then the object);
- downloads: ``GET /download/storage/v1/b/{bucket}/o/{name}?alt=media`` and
  ``GET /storage/v1/b/{bucket}/o/{name}?alt=media``, with ``x-goog-hash`` (crc32c and
  md5, which the client verifies), ``x-goog-generation`` and single ``Range`` requests;
- metadata: ``GET /storage/v1/b/{bucket}/o/{name}``; ``DELETE`` of the same path;
  ``GET /storage/v1/b/{bucket}`` (the client fetches its bucket in the background);
- errors in the JSON API's shape: ``{"error": {"code", "message", "errors": [{"reason",
  "message", "domain"}]}}``, 404 ``notFound`` for a missing bucket or object. A route
  that is not modelled answers 501 so a client change shows up as a failure rather
  than as a silent "not found".

Every request is recorded in :attr:`GcsDouble.requests` (method, path, query).
Fidelity notes: shapes follow the public JSON API reference; no auth, ACLs,
preconditions, versioning or listing. This is not GCS.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote, unquote

import google_crc32c

from tests.live_server import read_body, send_json, serve

_UPLOAD = re.compile(r"^/upload/storage/v1/b/(?P<bucket>[^/]+)/o$")
_BUCKET = re.compile(r"^/storage/v1/b/(?P<bucket>[^/]+)$")
_OBJECT = re.compile(r"^/(?P<download>download/)?storage/v1/b/(?P<bucket>[^/]+)/o/(?P<name>.+)$")
_CONTENT_RANGE = re.compile(r"^bytes (?:(?P<start>\d+)-(?P<end>\d+)|\*)/(?P<total>\d+|\*)$")
_RANGE = re.compile(r"^bytes=(?P<start>\d+)-(?P<end>\d*)$")
_BOUNDARY = re.compile(r'boundary="?(?P<boundary>[^";]+)"?')


@dataclass
class StoredObject:
    data: bytes
    generation: int
    content_type: str
    created: str

    @property
    def crc32c(self) -> str:
        return base64.b64encode(google_crc32c.value(self.data).to_bytes(4, "big")).decode()

    @property
    def md5(self) -> str:
        return base64.b64encode(hashlib.md5(self.data).digest()).decode()


@dataclass
class _Resumable:
    bucket: str
    name: str
    content_type: str
    received: bytearray = field(default_factory=bytearray)


class GcsError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def body(self) -> bytes:
        return json.dumps(
            {
                "error": {
                    "code": self.status,
                    "message": self.message,
                    "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
                }
            }
        ).encode()


class GcsDouble:
    """The ASGI app; :func:`serve_gcs_double` runs it and sets :attr:`endpoint`."""

    def __init__(self) -> None:
        self.endpoint = ""  # set once served
        self.buckets: dict[str, dict[str, StoredObject]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._uploads: dict[str, _Resumable] = {}
        self._generations = itertools.count(1_700_000_000_000_001)
        self._upload_ids = itertools.count(1)
        self._lock = threading.Lock()

    # -- test controls -------------------------------------------------------------
    def create_bucket(self, name: str) -> None:
        with self._lock:
            self.buckets.setdefault(name, {})

    def object_names(self, bucket: str) -> set[str]:
        with self._lock:
            return set(self.buckets[bucket])

    def upload_types(self) -> list[str]:
        """``uploadType`` of every upload request so far, in order (resumable PUTs included)."""
        with self._lock:
            return [q.get("uploadType", "") for _, path, q in self.requests if path.startswith("/upload/")]

    # -- ASGI ----------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        # raw_path keeps %2F inside object names apart from the path's own slashes.
        path = scope.get("raw_path", scope["path"].encode()).decode("latin-1").split("?", 1)[0]
        query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode("latin-1")).items()}
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = await read_body(receive)
        if path == "/healthz":
            await send_json(send, 200, b"{}")
            return
        with self._lock:
            self.requests.append((method, path, query))
            try:
                status, out_headers, payload = self._handle(method, path, query, headers, body)
            except GcsError as exc:
                await send_json(send, exc.status, exc.body())
                return
        if isinstance(payload, dict):
            await send_json(send, status, json.dumps(payload).encode())
            return
        await _send(send, status, payload, out_headers)

    def _handle(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], Any]:
        if m := _UPLOAD.match(path):
            bucket = self._bucket(unquote(m["bucket"]))
            kind = query.get("uploadType")
            if method == "POST" and kind == "multipart":
                return self._multipart(m["bucket"], bucket, headers, body)
            if method == "POST" and kind == "media":
                name = _required(query, "name")
                ctype = headers.get("content-type", "application/octet-stream")
                return 200, {}, self._store(unquote(m["bucket"]), bucket, name, body, ctype)
            if method == "POST" and kind == "resumable":
                return self._open_resumable(unquote(m["bucket"]), query, headers, body)
            if method == "PUT" and kind == "resumable":
                return self._resumable_chunk(query, headers, body)
        elif (m := _BUCKET.match(path)) and method == "GET":
            # The client looks its bucket up once, in the background, for trace attributes.
            name = unquote(m["bucket"])
            self._bucket(name)
            return (
                200,
                {},
                {
                    "kind": "storage#bucket",
                    "name": name,
                    "location": "US-CENTRAL1",
                    "locationType": "region",
                    "storageClass": "STANDARD",
                },
            )
        elif m := _OBJECT.match(path):
            bucket_name, name = unquote(m["bucket"]), unquote(m["name"])
            bucket = self._bucket(bucket_name)
            if method == "GET":
                obj = self._object(bucket_name, bucket, name, query)
                if m["download"] or query.get("alt") == "media":
                    return self._media(obj, headers)
                return 200, {}, self._resource(bucket_name, name, obj)
            if method == "DELETE":
                self._object(bucket_name, bucket, name, query)
                del bucket[name]
                return 204, {}, b""
        raise GcsError(501, "notImplemented", f"the GCS double does not model {method} {path}")

    # -- pieces --------------------------------------------------------------------
    def _bucket(self, name: str) -> dict[str, StoredObject]:
        if name not in self.buckets:
            raise GcsError(404, "notFound", "The specified bucket does not exist.")
        return self.buckets[name]

    def _object(
        self, bucket_name: str, bucket: dict[str, StoredObject], name: str, query: dict[str, str]
    ) -> StoredObject:
        obj = bucket.get(name)
        if obj is None or ("generation" in query and int(query["generation"]) != obj.generation):
            raise GcsError(404, "notFound", f"No such object: {bucket_name}/{name}")
        return obj

    def _store(
        self,
        bucket_name: str,
        bucket: dict[str, StoredObject],
        name: str,
        data: bytes,
        content_type: str,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        obj = StoredObject(bytes(data), next(self._generations), content_type, _now())
        # The client sends the checksum it computed; GCS refuses an upload that differs.
        for key, actual in (("crc32c", obj.crc32c), ("md5Hash", obj.md5)):
            if metadata and metadata.get(key) not in (None, actual):
                raise GcsError(400, "invalid", f"Provided {key} does not match the uploaded data.")
        bucket[name] = obj
        return self._resource(bucket_name, name, obj)

    def _multipart(
        self, raw_bucket: str, bucket: dict[str, StoredObject], headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], Any]:
        m = _BOUNDARY.search(headers.get("content-type", ""))
        if not m or not headers.get("content-type", "").startswith("multipart/related"):
            raise GcsError(400, "invalid", "multipart upload needs a multipart/related body")
        parts = body.split(b"--" + m["boundary"].encode())
        # ["", metadata part, media part, "--" + trailing]
        if len(parts) != 4 or not parts[3].startswith(b"--"):
            raise GcsError(400, "invalid", "multipart body must hold exactly a metadata and a media part")
        (_, meta_raw), (media_headers, data) = (_split_part(parts[1]), _split_part(parts[2]))
        metadata = json.loads(meta_raw)
        ctype = media_headers.get("content-type", "application/octet-stream")
        name = _required(metadata, "name")
        return 200, {}, self._store(unquote(raw_bucket), bucket, name, data, ctype, metadata)

    def _open_resumable(
        self, bucket_name: str, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], Any]:
        metadata = json.loads(body or b"{}")
        name = metadata.get("name") or _required(query, "name")
        upload_id = f"nimbus-double-{next(self._upload_ids)}"
        self._uploads[upload_id] = _Resumable(
            bucket_name, name, headers.get("x-upload-content-type", "application/octet-stream")
        )
        location = (
            f"{self.endpoint}/upload/storage/v1/b/{quote(bucket_name, safe='')}/o"
            f"?uploadType=resumable&upload_id={upload_id}"
        )
        return 200, {"location": location}, b""

    def _resumable_chunk(
        self, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], Any]:
        upload = self._uploads.get(query.get("upload_id", ""))
        if upload is None:
            raise GcsError(404, "notFound", "No such upload session.")
        m = _CONTENT_RANGE.match(headers.get("content-range", ""))
        if not m:
            raise GcsError(400, "invalid", f"bad Content-Range {headers.get('content-range')!r}")
        if m["start"] is not None:
            start, end = int(m["start"]), int(m["end"])
            if end - start + 1 != len(body) or start > len(upload.received):
                raise GcsError(400, "invalid", "chunk does not match Content-Range or leaves a gap")
            # A retried chunk may repeat bytes already held; keep only what is new.
            upload.received += body[len(upload.received) - start :]
        total = None if m["total"] == "*" else int(m["total"])
        if total is not None and len(upload.received) == total:
            del self._uploads[query["upload_id"]]
            bucket = self._bucket(upload.bucket)
            return (
                200,
                {},
                self._store(upload.bucket, bucket, upload.name, upload.received, upload.content_type),
            )
        out = {"range": f"bytes=0-{len(upload.received) - 1}"} if upload.received else {}
        return 308, out, b""

    def _media(self, obj: StoredObject, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        out = {
            "content-type": obj.content_type,
            "x-goog-hash": f"crc32c={obj.crc32c},md5={obj.md5}",
            "x-goog-generation": str(obj.generation),
            "x-goog-stored-content-length": str(len(obj.data)),
        }
        m = _RANGE.match(headers.get("range", ""))
        if not m:
            return 200, out, obj.data
        start = int(m["start"])
        end = min(int(m["end"]) if m["end"] else len(obj.data) - 1, len(obj.data) - 1)
        if start >= len(obj.data):
            raise GcsError(416, "requestedRangeNotSatisfiable", "The requested range cannot be satisfied.")
        out["content-range"] = f"bytes {start}-{end}/{len(obj.data)}"
        return 206, out, obj.data[start : end + 1]

    def _resource(self, bucket_name: str, name: str, obj: StoredObject) -> dict[str, Any]:
        quoted = quote(name, safe="")
        return {
            "kind": "storage#object",
            "id": f"{bucket_name}/{name}/{obj.generation}",
            "selfLink": f"{self.endpoint}/storage/v1/b/{bucket_name}/o/{quoted}",
            "mediaLink": (
                f"{self.endpoint}/download/storage/v1/b/{bucket_name}/o/{quoted}"
                f"?generation={obj.generation}&alt=media"
            ),
            "name": name,
            "bucket": bucket_name,
            "generation": str(obj.generation),
            "metageneration": "1",
            "contentType": obj.content_type,
            "storageClass": "STANDARD",
            "size": str(len(obj.data)),
            "md5Hash": obj.md5,
            "crc32c": obj.crc32c,
            "timeCreated": obj.created,
            "updated": obj.created,
        }


def _split_part(part: bytes) -> tuple[dict[str, str], bytes]:
    """One multipart part, ``\\r\\n<headers>\\r\\n\\r\\n<payload>\\r\\n``, as (headers, payload)."""
    head, _, payload = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
    headers = {}
    for line in head.decode("latin-1").split("\r\n"):
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return headers, payload.removesuffix(b"\r\n")


def _required(mapping: dict[str, Any], key: str) -> str:
    if not mapping.get(key):
        raise GcsError(400, "required", f"Required parameter: {key}")
    return mapping[key]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def _send(send: Any, status: int, body: bytes, headers: dict[str, str]) -> None:
    """A non-JSON answer (media, an empty 204/308, a Location); JSON goes through send_json."""
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": bytes(body)})


@contextmanager
def serve_gcs_double() -> Iterator[GcsDouble]:
    """Run a fresh :class:`GcsDouble` under uvicorn on a free loopback port."""
    double = GcsDouble()
    with serve(double, health_path="/healthz", lifespan="off") as url:
        double.endpoint = url
        yield double
