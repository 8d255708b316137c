"""Object storage for the Batch API's files: tenant-uploaded JSONL input, output and error files.

One small protocol, three implementations, chosen by URL with :func:`open_store`:

- ``s3://bucket/prefix``: :class:`S3Store` (boto3), in an AWS deployment;
- ``gs://bucket/prefix``: :class:`GCSStore` (google-cloud-storage), on GCP;
- ``file:///abs/path`` or a plain path: :class:`LocalDirStore`, for the embedded mode.

Terraform points the control plane at ``<scheme>://<region's artifact bucket>/batches``
(``NIMBUS_BATCH_STORE_URL``) and grants object read/write/delete under that prefix only.

Keys are validated the same way by every store (see :func:`check_key`), so a key that
works in the embedded mode works in the cloud and the other way round; a store joins
its prefix and a key with exactly one ``/``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

__all__ = [
    "GCSStore",
    "LocalDirStore",
    "ObjectNotFound",
    "ObjectStore",
    "S3Store",
    "check_key",
    "open_store",
]


class ObjectNotFound(KeyError):
    """No object under ``key`` in the store at ``url``.

    A :class:`KeyError`, so callers that treat a store like a mapping can catch that.
    """

    def __init__(self, key: str, url: str) -> None:
        super().__init__(key)
        self.key = key
        self.url = url

    def __str__(self) -> str:  # KeyError's own str() is just repr(key)
        return f"no object {self.key!r} in {self.url}"


@runtime_checkable
class ObjectStore(Protocol):
    """Whole-object reads and writes; a write replaces the object at once or not at all."""

    @property
    def url(self) -> str:
        """Where the store is, as :func:`open_store` accepts it (no credentials)."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Create or replace the object ``key``."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes; :class:`ObjectNotFound` when there is none."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; removing an absent object is not an error (retried tasks repeat it)."""
        ...

    def exists(self, key: str) -> bool: ...


def check_key(key: str) -> str:
    """Return ``key`` if it is a relative ``/``-separated name, else raise :class:`ValueError`.

    Rejected: empty keys, absolute keys, backslashes, NUL, and empty, ``.`` or ``..``
    segments. On disk those could escape the root or alias another key; in a bucket they
    are legal but would name a different object than the embedded mode does.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    if key.startswith("/"):
        raise ValueError(f"object key must be relative, got {key!r}")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"object key must not contain backslashes or NUL, got {key!r}")
    if any(segment in ("", ".", "..") for segment in key.split("/")):
        raise ValueError(f"object key must not have empty, '.' or '..' segments, got {key!r}")
    return key


def _normalise_prefix(prefix: str) -> str:
    """``"/batches/"`` → ``"batches"``; ``""`` stays empty. Inner segments follow :func:`check_key`."""
    prefix = (prefix or "").strip("/")
    return check_key(prefix) if prefix else ""


def _join(prefix: str, key: str) -> str:
    check_key(key)
    return f"{prefix}/{key}" if prefix else key


def _bucket_url(scheme: str, bucket: str, prefix: str) -> str:
    return f"{scheme}://{bucket}/{prefix}" if prefix else f"{scheme}://{bucket}"


# ---------------------------------------------------------------------------- local


class LocalDirStore:
    """Objects as files under ``root`` (embedded mode: one machine, no cloud).

    A write goes to a temporary file in the target's directory, is fsynced, then
    renamed over the target with :func:`os.replace`, which is atomic within one
    file system: a reader (or a crash) sees the old object or the new one, never half
    of one. Temporary files are removed when the write fails.

    Unlike a bucket, a directory cannot also be an object: after ``put("a/b", …)``,
    ``put("a", …)`` fails with an :class:`OSError`.
    """

    def __init__(self, root: Path | str) -> None:
        self._root = Path(root).absolute()

    @property
    def root(self) -> Path:
        return self._root

    @property
    def url(self) -> str:
        return self._root.as_uri()

    def _path(self, key: str) -> Path:
        path = self._root / check_key(key)
        # check_key already rules out ".." and absolute keys; this also refuses a
        # symlink inside the root that points out of it.
        if not path.resolve().is_relative_to(self._root.resolve()):
            raise ValueError(f"object key {key!r} resolves outside {self._root}")
        return path

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)  # make the rename itself survive a power cut

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(key, self.url) from None

    def delete(self, key: str) -> None:
        path = self._path(key)
        # Absent (or only a directory of other objects) means there is nothing to delete.
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            path.unlink()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the data itself is synced
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- S3


class S3Store:
    """Objects under ``s3://bucket/prefix`` (boto3).

    Every object is encrypted at rest: SSE-KMS with ``kms_key_id`` when given, else
    SSE-S3 (``AES256``). Sending the header on every put keeps that true even on a
    bucket without default encryption. The artifact bucket's default is the regional
    CMK, so an AWS deployment passes that key (``NIMBUS_BATCH_STORE_KMS_KEY_ID``) to
    keep batch files under it rather than under S3-managed keys.

    S3 answers 403 instead of 404 for a missing key when the caller may not
    ``s3:ListBucket`` the bucket, so the role needs that to get :class:`ObjectNotFound`
    rather than an access error (Terraform grants it).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        kms_key_id: str | None = None,
        session: Any | None = None,
    ) -> None:
        import boto3  # imported here so the embedded mode never needs a cloud SDK loaded
        import botocore.config

        if not bucket:
            raise ValueError("S3Store needs a bucket name")
        self._bucket = bucket
        self._prefix = _normalise_prefix(prefix)
        if kms_key_id:
            self._sse: dict[str, str] = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key_id}
        else:
            self._sse = {"ServerSideEncryption": "AES256"}
        # Path-style addressing for a custom endpoint (moto, MinIO): bucket names need
        # no DNS there.
        config = botocore.config.Config(
            retries={"mode": "standard", "max_attempts": 5},
            s3={"addressing_style": "path"} if endpoint_url else None,
        )
        self._client = (session or boto3.Session()).client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )

    @property
    def url(self) -> str:
        return _bucket_url("s3", self._bucket, self._prefix)

    def put(self, key: str, data: bytes) -> None:
        self._client.put_object(Bucket=self._bucket, Key=_join(self._prefix, key), Body=data, **self._sse)

    def get(self, key: str) -> bytes:
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=_join(self._prefix, key))
        except self._client.exceptions.ClientError as exc:
            if _s3_missing(exc):
                raise ObjectNotFound(key, self.url) from None
            raise
        with contextlib.closing(response["Body"]) as body:
            return body.read()

    def delete(self, key: str) -> None:
        # S3 answers 204 for an absent key too, so this is idempotent as it stands.
        self._client.delete_object(Bucket=self._bucket, Key=_join(self._prefix, key))

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self._bucket, Key=_join(self._prefix, key))
        except self._client.exceptions.ClientError as exc:
            if _s3_missing(exc):
                return False
            raise
        return True


def _s3_missing(exc: Any) -> bool:
    # GetObject says NoSuchKey; HeadObject has no body, so only the status: "404".
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return error.get("Code") in {"NoSuchKey", "404", "NotFound"} or (
        status == 404 and error.get("Code") != "NoSuchBucket"
    )


# ---------------------------------------------------------------------------- GCS


class GCSStore:
    """Objects under ``gs://bucket/prefix`` (google-cloud-storage, JSON API).

    Objects take the bucket's default encryption (the artifact bucket's regional
    CMEK key); nothing is set per object. The client uploads up to 8 MiB in one
    multipart request and larger objects as a resumable upload; both replace the
    object atomically.

    ``endpoint_url`` points the client at a stand-in of the JSON API and uses
    anonymous credentials (tests); otherwise ``credentials`` or Application Default
    Credentials are used.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        project: str | None = None,
        credentials: Any | None = None,
    ) -> None:
        from google.api_core import exceptions as gexc
        from google.cloud import storage
        from google.cloud.storage.retry import DEFAULT_RETRY

        if not bucket:
            raise ValueError("GCSStore needs a bucket name")
        self._prefix = _normalise_prefix(prefix)
        self._not_found = gexc.NotFound
        # The library retries uploads only when they carry a generation precondition.
        # Ours may be retried without one: a put replaces the whole object with the
        # same bytes, so repeating it leaves the same result.
        self._retry = DEFAULT_RETRY
        options: dict[str, Any] | None = None
        if endpoint_url:
            from google.auth.credentials import AnonymousCredentials

            options = {"api_endpoint": endpoint_url}
            credentials = credentials or AnonymousCredentials()
        client = storage.Client(project=project, credentials=credentials, client_options=options)
        self._bucket = client.bucket(bucket)

    @property
    def url(self) -> str:
        return _bucket_url("gs", self._bucket.name, self._prefix)

    def _blob(self, key: str) -> Any:
        return self._bucket.blob(_join(self._prefix, key))

    def put(self, key: str, data: bytes) -> None:
        self._blob(key).upload_from_string(data, content_type="application/octet-stream", retry=self._retry)

    def get(self, key: str) -> bytes:
        try:
            return self._blob(key).download_as_bytes(retry=self._retry)
        except self._not_found:
            raise ObjectNotFound(key, self.url) from None

    def delete(self, key: str) -> None:
        try:
            self._blob(key).delete(retry=self._retry)
        except self._not_found:
            pass  # absent already: a repeated delete is a success

    def exists(self, key: str) -> bool:
        return self._blob(key).exists(retry=self._retry)


# ---------------------------------------------------------------------------- by URL


def open_store(url: str, *, endpoint_url: str | None = None, kms_key_id: str | None = None) -> ObjectStore:
    """The store ``url`` names: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``file:///abs/path`` or a plain filesystem path.

    ``endpoint_url`` reaches an S3 or GCS stand-in; ``kms_key_id`` selects SSE-KMS
    for S3. Both are ignored for a local directory, which has neither.
    """
    if not url or not isinstance(url, str):
        raise ValueError(
            "object store URL is empty; use s3://bucket/prefix, gs://bucket/prefix, "
            "file:///abs/path or a filesystem path"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("s3", "gs"):
        if not parts.netloc or parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError(
                f"object store URL {url!r}: expected {scheme}://bucket[/prefix], "
                "without credentials, query or fragment"
            )
        if scheme == "s3":
            return S3Store(parts.netloc, parts.path, endpoint_url=endpoint_url, kms_key_id=kms_key_id)
        return GCSStore(parts.netloc, parts.path, endpoint_url=endpoint_url)
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.query:
            raise ValueError(f"object store URL {url!r}: expected file:///absolute/path")
        return LocalDirStore(Path(unquote(parts.path)))
    if "://" in url:
        raise ValueError(
            f"object store URL {url!r}: unsupported scheme {parts.scheme!r}; use "
            "s3://bucket/prefix, gs://bucket/prefix, file:///abs/path or a filesystem path"
        )
    return LocalDirStore(Path(url))
