"""Where the edge's picture of the world comes from, and the contracts with the control plane.

The edge never reads Postgres. It holds one *snapshot* (a JSON document) and swaps it atomically
when a newer one arrives. Two sources produce snapshots:

* ``ControlPlaneSource``: polls the control plane.
* ``StaticSource``: a standalone config file (see ``standalone.py``); no control plane needed.

Contract 1: snapshot
--------------------
``GET {NIMBUS_CONTROL_PLANE_URL}/internal/v1/edge/snapshot``

Request headers: ``Authorization: Bearer {edge token}``; ``If-None-Match: <etag>`` once the edge
holds a snapshot. Answers: ``200`` with the JSON body below and an ``ETag`` header (the same value
as the body's ``etag``); ``304`` with no body when the edge's etag is current; ``401`` for a bad
edge token. The edge polls every ``snapshot_poll_s`` (default 2 s) so a revoked key stops working
within 5 s. Every good snapshot is written atomically to ``{state_dir}/snapshot.json``; at start, if
the control plane cannot be reached, the edge serves from that file (and keeps polling).

Body::

    {"etag": "...", "generated_at": "ISO-8601",
     "tenants": [{"id": "uuid", "name": "acme", "status": "active|suspended", "weight": 1.0,
                  "limits": {"requests_per_minute": int|null, "tokens_per_minute": int|null,
                             "max_concurrent_requests": int|null, "monthly_token_budget": int|null,
                             "monthly_tokens_used": int},
                  "response_cache": false}],
     "keys": [{"id": "uuid", "tenant_id": "uuid", "prefix": "nmb_ab12cd34",
               "sha256": "<hex sha256 of the full key string>",
               "scopes": ["inference"], "expires_at": "ISO-8601"|null,
               "priority": "interactive|batch"}],
     "models": [{"name": "llama-3.1-8b-instruct", "default_tier": "bf16",
                 "variants": [{"id": "uuid", "tier": "bf16", "context_length": 8192,
                               "served_model_name": "llama-3.1-8b-instruct-bf16"}]}],
     "pools": [{"id": "uuid", "variant_id": "uuid", "kind": "warm|scale_to_zero",
                "dedicated_tenant_id": "uuid"|null}],
     "replicas": [{"id": "uuid", "pool_id": "uuid", "variant_id": "uuid", "region": "aws/us-east-1",
                   "url": "http://10.0.1.5:30000", "state": "ready|draining",
                   "max_running_requests": int, "max_total_tokens": int,
                   "metrics": {"num_running_reqs": n, "num_queue_reqs": n,
                               "token_usage": 0.0-1.0, "cache_hit_rate": 0.0-1.0}}],
     "regions": [{"name": "aws/us-east-1", "rtt_ms": null|float}]}

Semantics: a dedicated pool serves only its tenant; a key of tenant T may use shared pools and T's
dedicated pools. Keys are ``nmb_`` + 8-char prefix id + ``_`` + secret; the snapshot carries only
the sha256 hex of the whole key string, never a secret. Only ``ready`` replicas take new requests.
``rtt_ms: null`` means "measure it" (the edge times its health probes). ``monthly_tokens_used`` is
the rolled-up usage; the edge adds what it has metered since (Redis) and takes the larger.

Contract 2: activation (scale from zero)
----------------------------------------
``POST {cp}/internal/v1/edge/activate`` with the same bearer token and body
``{"pool_id": "uuid", "variant_id": "uuid"}``; answers ``202``. The edge sends it when a request
arrives for a variant whose usable pools have no ready replica (at most once per pool per
``activation_repeat_s``), then holds the request until a snapshot shows a ready replica or
``activation_timeout_s`` passes (then 503 with ``retry-after``).

Contract 3: usage stream
------------------------
Redis stream ``nimbus:usage`` (configurable), one event per finished request, success or error;
an edge writes up to a hundred events to one stream entry, as a JSON array in the entry's
``events`` field (an entry without it is one event, its fields the event's:
``controlplane/services/usage_rollup.py::events_of`` reads both). An event's fields, all strings: ``request_id`` (unique per request, the edge's id; consumers dedupe on
it), ``tenant_id``, ``key_id``, ``variant_id``, ``model``, ``region``, ``replica_id``,
``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``queue_ms``, ``ttft_ms``,
``duration_ms``, ``status`` (``ok|error|client_abort|rejected``), ``http_status``, ``ts`` (unix
seconds, float, request start), ``cache`` (``hit`` for an answer from the response cache, which
used no GPU tokens; empty otherwise). Unknown values are empty strings. Every event is first appended
to ``{state_dir}/usage-spool.jsonl`` (one ``write()`` before the response's last bytes are sent;
fsynced every ``usage_fsync_s``), then ``XADD``ed; the spool is truncated (or its rotated files
deleted) only after their ``XADD``s succeeded, replayed in order while Redis is down and at every
start, so a crash of the edge process can repeat but never lose one (hence the dedupe on
``request_id``); a machine crash can lose the last ``usage_fsync_s`` (``usage.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

log = logging.getLogger("nimbus.edge.snapshot")

SNAPSHOT_PATH = "/internal/v1/edge/snapshot"
ACTIVATE_PATH = "/internal/v1/edge/activate"


def save_snapshot(state_dir: Path, snap: dict[str, Any]) -> None:
    """Atomic write: a crash mid-write never leaves a torn file for the next start to trip on."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / "snapshot.json.tmp"
    tmp.write_text(json.dumps(snap))
    os.replace(tmp, state_dir / "snapshot.json")


def load_saved_snapshot(state_dir: Path) -> dict[str, Any] | None:
    path = state_dir / "snapshot.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class ControlPlaneSource:
    """Polls the control plane with ETags; falls back to the last snapshot on disk."""

    def __init__(
        self,
        base_url: str,
        token: str,
        state_dir: Path,
        on_snapshot: Callable[[dict[str, Any]], None],
        poll_s: float = 2.0,
        timeout_s: float = 3.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.state_dir = state_dir
        self.on_snapshot = on_snapshot
        self.poll_s = poll_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.etag: str | None = None
        self.last_ok: float | None = None
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self.timeout)
        if not await self.poll_once():
            saved = load_saved_snapshot(self.state_dir)
            if saved is not None:
                log.warning("control plane unreachable; serving the saved snapshot %s", saved.get("etag"))
                self.on_snapshot(saved)
            else:
                log.error("control plane unreachable and no saved snapshot; serving nothing until it answers")
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session:
            await self._session.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.poll_once()

    async def poll_once(self) -> bool:
        assert self._session is not None
        headers = self.headers
        if self.etag:
            headers["If-None-Match"] = self.etag
        try:
            async with self._session.get(self.base_url + SNAPSHOT_PATH, headers=headers) as resp:
                if resp.status == 304:
                    self.last_ok = time.monotonic()
                    return True
                if resp.status != 200:
                    log.warning("snapshot poll answered %s", resp.status)
                    return False
                snap = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("snapshot poll failed: %r", exc)
            return False
        self.etag = str(snap.get("etag") or "")
        self.last_ok = time.monotonic()
        self.on_snapshot(snap)
        try:
            save_snapshot(self.state_dir, snap)
        except OSError as exc:  # a full disk must not stop serving
            log.warning("could not persist snapshot: %r", exc)
        return True

    async def activate(self, pool_id: str, variant_id: str) -> bool:
        if self._session is None:
            return False
        try:
            async with self._session.post(
                self.base_url + ACTIVATE_PATH, headers=self.headers,
                json={"pool_id": pool_id, "variant_id": variant_id},
            ) as resp:
                return resp.status in (200, 202)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("activation request failed: %r", exc)
            return False


class StaticSource:
    """Standalone mode: one snapshot built from a config file; nothing to poll, nothing to activate."""

    def __init__(self, snapshot: dict[str, Any], on_snapshot: Callable[[dict[str, Any]], None]) -> None:
        self.snapshot = snapshot
        self.on_snapshot = on_snapshot

    async def start(self) -> None:
        self.on_snapshot(self.snapshot)

    async def stop(self) -> None:
        return None

    async def activate(self, pool_id: str, variant_id: str) -> bool:
        return False
