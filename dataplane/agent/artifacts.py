"""Model artifacts: a node-local cache in front of a regional shared cache in front of the source.

Lookup order for a model path:

1. a local directory (the image or a volume already holds the weights): used in place;
2. ``model_cache_dir`` (node-local disk): a complete earlier copy;
3. ``shared_cache_dir`` (the region's shared file system, e.g. EFS/Filestore mounted on every
   node), copied to local disk so loading never reads over the network;
4. ``source`` (``s3://bucket/prefix``, ``gs://…``, ``file:///dir`` or a plain directory):
   downloaded into the shared cache when there is one (the next node of the region finds it
   there), then to local disk;
5. nothing configured: the path goes to the engine unchanged (SGLang resolves hub ids itself)
   and the download is timed as part of loading.

A copy becomes visible only when complete (written under a temporary name, then renamed), and
an ``flock`` per entry makes concurrent agents on one shared cache download once. The node-local
cache is bounded: :func:`evict` deletes the least recently used checkpoints that no replica of
the node runs once the cache outgrows its share of the disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

COMPLETE_MARKER = ".nimbus-complete"


@dataclass(frozen=True)
class Fetched:
    path: str  # what the engine's --model-path gets
    source: str  # "local_dir" | "local_cache" | "shared_cache" | "source" | "engine"
    download_s: float
    bytes: int = 0
    on_node: bool = False  # the weights were on this node's disk before the fetch: nothing was downloaded


def cache_key(model_path: str) -> str:
    """A readable, collision-free directory name for a model path."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "--", model_path.strip("/"))[:80]
    return f"{readable}-{hashlib.sha256(model_path.encode()).hexdigest()[:10]}"


def _complete(directory: Path) -> bool:
    return (directory / COMPLETE_MARKER).exists()


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)


@contextmanager
def _entry_lock(cache_dir: Path, key: str):
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _publish(cache_dir: Path, key: str, fill: Callable[[Path], None], model_path: str) -> Path:
    """Fill a temporary directory, mark it complete (with the model path it holds, which
    :func:`cached` reads back) and rename it into place."""
    final = cache_dir / key
    tmp = cache_dir / f".{key}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        (tmp / COMPLETE_MARKER).write_text(json.dumps(
            {"model_path": model_path, "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
        if final.exists():  # an incomplete leftover from a crash
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _copy_tree(src: Path) -> Callable[[Path], None]:
    def fill(dest: Path) -> None:
        for item in src.iterdir():
            if item.name == COMPLETE_MARKER:
                continue
            if item.is_dir():
                shutil.copytree(item, dest / item.name)
            else:
                shutil.copy2(item, dest / item.name)

    return fill


def _download_s3(bucket: str, prefix: str) -> Callable[[Path], None]:
    def fill(dest: Path) -> None:
        import boto3  # only nodes that pull from S3 need it loaded

        s3 = boto3.client("s3")
        found = False
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix.rstrip("/")) + 1:]
                if not rel or rel.endswith("/"):
                    continue
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, obj["Key"], str(target))
                found = True
        if not found:
            raise FileNotFoundError(f"no objects under s3://{bucket}/{prefix}")

    return fill


def _download_gcs(bucket: str, prefix: str) -> Callable[[Path], None]:
    def fill(dest: Path) -> None:
        try:
            from google.cloud import storage  # type: ignore[import-not-found]
        except ImportError as exc:  # pragma: no cover - depends on the image
            raise RuntimeError("gs:// artifact sources need google-cloud-storage on the node") from exc
        client = storage.Client()
        found = False
        for blob in client.list_blobs(bucket, prefix=prefix.rstrip("/") + "/"):
            rel = blob.name[len(prefix.rstrip("/")) + 1:]
            if not rel or rel.endswith("/"):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(str(target))
            found = True
        if not found:
            raise FileNotFoundError(f"no objects under gs://{bucket}/{prefix}")

    return fill


def source_filler(source: str, model_path: str) -> Callable[[Path], None]:
    """How to fetch ``model_path`` from ``source``: ``<source>/<model_path>``."""
    parsed = urlparse(source)
    rel = model_path.strip("/")
    if parsed.scheme == "s3":
        return _download_s3(parsed.netloc, f"{parsed.path.strip('/')}/{rel}".strip("/"))
    if parsed.scheme == "gs":
        return _download_gcs(parsed.netloc, f"{parsed.path.strip('/')}/{rel}".strip("/"))
    if parsed.scheme in ("", "file"):
        src = Path(parsed.path if parsed.scheme else source) / rel
        if not src.is_dir():
            raise FileNotFoundError(f"artifact source has no {rel!r} ({src})")
        return _copy_tree(src)
    raise ValueError(f"unsupported artifact source {source!r}")


def _used(entry: Path) -> None:
    """Mark a complete entry used now: eviction takes the least recently used first."""
    with contextlib.suppress(OSError):
        os.utime(entry / COMPLETE_MARKER)


def _model_path_of(entry: Path) -> str | None:
    try:
        model_path = json.loads((entry / COMPLETE_MARKER).read_text()).get("model_path")
    except (OSError, ValueError, AttributeError):
        return None
    return model_path if isinstance(model_path, str) and entry.name == cache_key(model_path) else None


def evict(local_cache_dir: str | Path, *, max_bytes: int, keep: Iterable[str] = ()) -> list[str]:
    """Delete the least recently used complete entries (fetched or last found longest ago) until
    the cache holds at most ``max_bytes``, never one of the model paths in ``keep`` (what this
    node's replicas run: an engine restart reads it again). Returns the model paths deleted (an
    entry whose marker predates the recorded path by its directory name)."""
    root = Path(local_cache_dir)
    if not root.is_dir():
        return []
    kept = {cache_key(m) for m in keep}
    entries = []
    for marker in root.glob(f"*/{COMPLETE_MARKER}"):
        with contextlib.suppress(OSError):
            entries.append((marker.stat().st_mtime, marker.parent, _size(marker.parent)))
    total = sum(size for _, _, size in entries)
    evicted = []
    for _, entry, size in sorted(entries, key=lambda e: (e[0], e[1].name)):
        if total <= max_bytes:
            break
        if entry.name in kept:
            continue
        name = _model_path_of(entry) or entry.name
        with _entry_lock(root, entry.name):  # not while a fetch of this node writes or reads it
            doomed = root / f".{entry.name}.{uuid.uuid4().hex[:8]}.evicted"
            try:
                entry.rename(doomed)  # gone for every reader at once, then deleted
            except OSError:
                continue
        shutil.rmtree(doomed, ignore_errors=True)
        total -= size
        evicted.append(name)
    return evicted


def cached(local_cache_dir: str | Path) -> list[str]:
    """The model paths whose complete copy the local cache holds (what the node reports, so
    placement can start their replicas here without a download). An entry completed by an agent
    older than the model path in its marker is left out: its model path is unknown."""
    root = Path(local_cache_dir)
    found = (_model_path_of(m.parent) for m in sorted(root.glob(f"*/{COMPLETE_MARKER}"))) if root.is_dir() else ()
    return [m for m in found if m is not None]


def fetch(model_path: str, *, local_cache_dir: str | Path, shared_cache_dir: str | Path | None = None,
          source: str | None = None) -> Fetched:
    """Make ``model_path`` available on local disk (see the module docstring for the order)."""
    started = time.monotonic()
    if Path(model_path).is_dir():
        return Fetched(model_path, "local_dir", 0.0, on_node=True)
    key = cache_key(model_path)
    local_dir = Path(local_cache_dir)
    local = local_dir / key
    if _complete(local):
        _used(local)
        return Fetched(str(local), "local_cache", 0.0, on_node=True)
    shared = Path(shared_cache_dir) / key if shared_cache_dir else None
    if shared is None and not source:
        return Fetched(model_path, "engine", 0.0)
    with _entry_lock(local_dir, key):
        if _complete(local):  # another replica of this node fetched it while we waited
            return Fetched(str(local), "local_cache", time.monotonic() - started)
        origin = "shared_cache"
        if shared is not None:
            with _entry_lock(shared.parent, key):
                if not _complete(shared):
                    if not source:
                        return Fetched(model_path, "engine", 0.0)
                    _publish(shared.parent, key, source_filler(source, model_path), model_path)
                    origin = "source"
            _publish(local_dir, key, _copy_tree(shared), model_path)
        else:
            assert source is not None
            _publish(local_dir, key, source_filler(source, model_path), model_path)
            origin = "source"
    return Fetched(str(local), origin, time.monotonic() - started, _size(local))
