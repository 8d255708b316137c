"""infra.objectstore: the same behaviour from a local directory, S3 and GCS.

S3 is a real ``moto.server`` over HTTP; GCS is the JSON API test double in
tests/infra/gcs_double.py driven by the real google-cloud-storage client.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import boto3
import botocore.exceptions
import httpx
import pytest

from infra.objectstore import (
    GCSStore,
    LocalDirStore,
    ObjectNotFound,
    ObjectStore,
    S3Store,
    open_store,
)
from tests.infra.conftest import AWS_REGION
from tests.infra.gcs_double import GcsDouble

PREFIX = "batches"
FIVE_MB = os.urandom(5 * 1024 * 1024)
ALL_BYTES = bytes(range(256)) * 4


@dataclass
class Backend:
    name: str
    store: ObjectStore
    stored_names: Callable[[], set[str]]  # what the backend itself holds, prefix included
    endpoint_url: str | None = None


@pytest.fixture(params=["local", "s3", "gcs"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        # The store's root is <tmp>/batches, so the names on disk read like the buckets'.
        store = LocalDirStore(tmp_path / PREFIX)
        return Backend(
            "local",
            store,
            lambda: {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()},
        )
    if request.param == "s3":
        moto = request.getfixturevalue("moto_endpoint")
        session = request.getfixturevalue("aws_session")
        bucket = request.getfixturevalue("s3_bucket")
        client = session.client("s3", endpoint_url=moto)

        def s3_names() -> set[str]:
            return {o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])}

        return Backend("s3", S3Store(bucket, PREFIX, endpoint_url=moto, session=session), s3_names, moto)
    gcs: GcsDouble = request.getfixturevalue("gcs_server")
    bucket = request.getfixturevalue("gcs_bucket")
    store = GCSStore(bucket, PREFIX, endpoint_url=gcs.endpoint)
    return Backend("gcs", store, lambda: gcs.object_names(bucket), gcs.endpoint)


# ------------------------------------------------------------------ every store


def test_every_store_satisfies_the_protocol(backend: Backend):
    assert isinstance(backend.store, ObjectStore)
    scheme = {"local": "file://", "s3": "s3://", "gcs": "gs://"}[backend.name]
    assert backend.store.url.startswith(scheme) and backend.store.url.endswith(f"/{PREFIX}")


@pytest.mark.parametrize(
    "data", [b"", b'{"custom_id": "r1"}\n', ALL_BYTES, FIVE_MB], ids=["empty", "jsonl", "binary", "5MB"]
)
def test_put_then_get_returns_the_same_bytes(backend: Backend, data: bytes):
    backend.store.put("files/file-1", data)
    assert backend.store.get("files/file-1") == data
    assert backend.stored_names() == {f"{PREFIX}/files/file-1"}


def test_put_replaces_the_whole_object(backend: Backend):
    backend.store.put("out.jsonl", b"a much longer first version of the object\n" * 100)
    backend.store.put("out.jsonl", b"short\n")
    assert backend.store.get("out.jsonl") == b"short\n"
    assert backend.stored_names() == {f"{PREFIX}/out.jsonl"}


def test_get_of_a_missing_key_raises_object_not_found(backend: Backend):
    with pytest.raises(ObjectNotFound) as info:
        backend.store.get("files/never-written")
    assert isinstance(info.value, KeyError)
    assert info.value.key == "files/never-written"
    assert backend.store.url in str(info.value)


def test_delete_removes_the_object_and_is_idempotent(backend: Backend):
    backend.store.put("files/f", b"x")
    backend.store.put("files/keep", b"y")
    backend.store.delete("files/f")
    backend.store.delete("files/f")  # a retried task deletes again
    backend.store.delete("files/never-written")
    with pytest.raises(ObjectNotFound):
        backend.store.get("files/f")
    assert backend.store.get("files/keep") == b"y"
    assert backend.stored_names() == {f"{PREFIX}/files/keep"}


def test_exists_follows_put_and_delete(backend: Backend):
    assert backend.store.exists("files/f") is False
    backend.store.put("files/f", b"")
    assert backend.store.exists("files/f") is True
    # A name that is only a "directory" of other objects is not an object.
    assert backend.store.exists("files") is False
    backend.store.delete("files/f")
    assert backend.store.exists("files/f") is False


def test_nested_keys_are_joined_to_the_prefix_with_one_slash(backend: Backend):
    keys = {
        "files/tenant-1/file-abc": b"input",
        "files/tenant-1/file-abc.out": b"output",
        "a/b/c/d/e.jsonl": b"deep",
        "top": b"top",
    }
    for key, data in keys.items():
        backend.store.put(key, data)
    assert {key: backend.store.get(key) for key in keys} == keys
    assert backend.stored_names() == {f"{PREFIX}/{key}" for key in keys}


BAD_KEYS = ["", "/abs", "../escape", "a/../../escape", "a/./b", "a//b", "a/", "a\\b", "..", "a\x00b"]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_keys_that_escape_or_alias_are_rejected_everywhere(backend: Backend, key: str):
    for call in (
        lambda: backend.store.put(key, b"x"),
        lambda: backend.store.get(key),
        lambda: backend.store.delete(key),
        lambda: backend.store.exists(key),
    ):
        with pytest.raises(ValueError):
            call()
    assert backend.stored_names() == set()


def test_the_url_reopens_the_same_store(backend: Backend, monkeypatch: pytest.MonkeyPatch):
    # open_store builds its own boto3 session: give it moto's fake credentials.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", AWS_REGION)
    backend.store.put("files/f", b"written by the first handle")
    again = open_store(backend.store.url, endpoint_url=backend.endpoint_url)
    assert type(again) is type(backend.store)
    assert again.url == backend.store.url
    assert again.get("files/f") == b"written by the first handle"
    again.delete("files/f")
    assert backend.store.exists("files/f") is False


# ------------------------------------------------------------------ local directory


def test_local_creates_its_root_and_parent_directories(tmp_path: Path):
    root = tmp_path / "not" / "yet"
    store = LocalDirStore(root)
    assert not root.exists()
    store.put("a/b/c", b"x")
    assert (root / "a" / "b" / "c").read_bytes() == b"x"
    assert store.url == root.as_uri()


def test_local_failed_write_keeps_the_old_object_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = LocalDirStore(tmp_path)
    store.put("files/f", b"old content")

    def crash(src, dst):
        raise OSError("simulated crash between the temp write and the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.put("files/f", b"new content that must not half-appear")
    monkeypatch.undo()
    assert store.get("files/f") == b"old content"
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == ["f"]


def test_local_killed_writer_never_leaves_a_partial_object(tmp_path: Path):
    """A process that dies after writing the temp file, before the rename, leaves the old object."""
    store = LocalDirStore(tmp_path)
    store.put("files/f", b"old content")
    script = textwrap.dedent(
        f"""
        import os
        from infra.objectstore import LocalDirStore
        os.replace = lambda src, dst: os._exit(9)
        LocalDirStore({str(tmp_path)!r}).put("files/f", b"new" * 100_000)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2], timeout=60
    )
    assert result.returncode == 9
    assert store.get("files/f") == b"old content"
    # What the dead writer left is a hidden temp file, never the key itself.
    leftovers = [p.name for p in (tmp_path / "files").iterdir() if p.name != "f"]
    assert all(name.startswith(".f.") and name.endswith(".tmp") for name in leftovers)


def test_local_syncs_the_data_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda s, d: (events.append("replace"), real_replace(s, d))[1])
    LocalDirStore(tmp_path).put("f", b"data")
    assert events[:2] == ["fsync", "replace"]
    assert (tmp_path / "f").read_bytes() == b"data"


def test_local_refuses_a_symlink_out_of_the_root(tmp_path: Path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    store = LocalDirStore(root)
    with pytest.raises(ValueError, match="outside"):
        store.put("link/x", b"x")
    assert list(outside.iterdir()) == []


def test_local_directory_of_objects_is_not_an_object(tmp_path: Path):
    store = LocalDirStore(tmp_path)
    store.put("a/b", b"x")
    with pytest.raises(ObjectNotFound):
        store.get("a")
    store.delete("a")  # nothing to delete: a directory is not an object
    assert store.get("a/b") == b"x"


# ------------------------------------------------------------------ S3


def test_s3_objects_are_encrypted_with_sse_s3_by_default(
    moto_endpoint: str, aws_session: boto3.Session, s3_bucket: str
):
    S3Store(s3_bucket, PREFIX, endpoint_url=moto_endpoint, session=aws_session).put("f", b"x")
    head = aws_session.client("s3", endpoint_url=moto_endpoint).head_object(
        Bucket=s3_bucket, Key=f"{PREFIX}/f"
    )
    assert head["ServerSideEncryption"] == "AES256"


def test_s3_objects_use_the_kms_key_when_one_is_given(
    moto_endpoint: str, aws_session: boto3.Session, s3_bucket: str
):
    key_arn = aws_session.client("kms", endpoint_url=moto_endpoint).create_key()["KeyMetadata"]["Arn"]
    store = S3Store(s3_bucket, PREFIX, endpoint_url=moto_endpoint, session=aws_session, kms_key_id=key_arn)
    store.put("f", b"secret")
    head = aws_session.client("s3", endpoint_url=moto_endpoint).head_object(
        Bucket=s3_bucket, Key=f"{PREFIX}/f"
    )
    assert head["ServerSideEncryption"] == "aws:kms"
    assert head["SSEKMSKeyId"] == key_arn
    assert store.get("f") == b"secret"


@pytest.mark.parametrize(
    ("prefix", "stored", "url"),
    [
        ("batches", "batches/f", "s3://{b}/batches"),
        ("/batches/", "batches/f", "s3://{b}/batches"),
        ("a/b", "a/b/f", "s3://{b}/a/b"),
        ("", "f", "s3://{b}"),
    ],
)
def test_s3_prefix_forms(moto_endpoint: str, aws_session: boto3.Session, s3_bucket: str, prefix, stored, url):
    store = S3Store(s3_bucket, prefix, endpoint_url=moto_endpoint, session=aws_session)
    store.put("f", b"x")
    listed = aws_session.client("s3", endpoint_url=moto_endpoint).list_objects_v2(Bucket=s3_bucket)[
        "Contents"
    ]
    assert [o["Key"] for o in listed] == [stored]
    assert store.url == url.format(b=s3_bucket)


def test_s3_missing_bucket_is_a_configuration_error_not_a_missing_object(
    moto_endpoint: str, aws_session: boto3.Session
):
    store = S3Store("nimbus-no-such-bucket", PREFIX, endpoint_url=moto_endpoint, session=aws_session)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        store.get("f")
    assert not isinstance(info.value, ObjectNotFound)
    assert info.value.response["Error"]["Code"] == "NoSuchBucket"


# ------------------------------------------------------------------ GCS


def test_gcs_small_objects_use_one_multipart_upload_and_large_ones_a_resumable_one(
    gcs_server: GcsDouble, gcs_bucket: str
):
    store = GCSStore(gcs_bucket, PREFIX, endpoint_url=gcs_server.endpoint)
    before = len(gcs_server.upload_types())
    store.put("small", FIVE_MB)
    assert gcs_server.upload_types()[before:] == ["multipart"]
    large = os.urandom(9 * 1024 * 1024)  # over the client's 8 MiB multipart limit
    store.put("large", large)
    assert gcs_server.upload_types()[before + 1 :] == ["resumable", "resumable"]  # open, then one PUT
    assert store.get("large") == large
    assert store.get("small") == FIVE_MB


def test_gcs_double_answers_missing_objects_in_the_json_api_error_shape(
    gcs_server: GcsDouble, gcs_bucket: str
):
    answer = httpx.get(f"{gcs_server.endpoint}/storage/v1/b/{gcs_bucket}/o/{PREFIX}%2Fnope")
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["code"] == 404
    assert error["errors"][0]["reason"] == "notFound"
    assert error["message"] == f"No such object: {gcs_bucket}/{PREFIX}/nope"
    unmodelled = httpx.post(f"{gcs_server.endpoint}/storage/v1/b/{gcs_bucket}/o/x/compose")
    assert unmodelled.status_code == 501


# ------------------------------------------------------------------ open_store


def test_open_store_picks_the_store_from_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gcs_server: GcsDouble
):
    monkeypatch.chdir(tmp_path)
    s3 = open_store("s3://nimbus-artifacts/batches")
    assert isinstance(s3, S3Store) and s3.url == "s3://nimbus-artifacts/batches"
    assert open_store("s3://nimbus-artifacts").url == "s3://nimbus-artifacts"
    gcs = open_store("gs://nimbus-artifacts/batches/", endpoint_url=gcs_server.endpoint)
    assert isinstance(gcs, GCSStore) and gcs.url == "gs://nimbus-artifacts/batches"
    local = open_store((tmp_path / "files").as_uri())
    assert isinstance(local, LocalDirStore) and local.root == tmp_path / "files"
    plain = open_store(str(tmp_path / "plain"))
    assert isinstance(plain, LocalDirStore) and plain.root == tmp_path / "plain"
    relative = open_store("rel/dir")
    assert isinstance(relative, LocalDirStore) and relative.root == tmp_path / "rel" / "dir"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "http://example.com/batches",
        "azure://container/x",
        "s3://",
        "s3:///batches",
        "gs://bkt/x?versions=1",
        "s3://key:secret@bkt/x",
        "file://remotehost/srv/files",
        "file:relative",
        "s3://bkt/a//b",
        "gs://bkt/../x",
    ],
)
def test_open_store_rejects_what_it_cannot_open(url: str):
    with pytest.raises(ValueError, match=r"object (store URL|key)"):
        open_store(url)
