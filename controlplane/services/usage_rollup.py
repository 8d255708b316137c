"""Usage rollup, consumer side: the edges' Redis stream into minute buckets, nothing lost or doubled.

An entry carries a JSON array of events in its ``events`` field (an edge writes up to a hundred
to an entry); an entry without it is one event, its fields the event's (edges before the
batching, and anything written by hand). ``events_of`` reads both.

Entries are read with a consumer group. Each batch is ingested in one database
transaction (``usage.ingest`` is exactly-once by ``request_id``), committed, and only
then acknowledged and deleted from the stream. A consumer that dies between commit and
ack leaves its entries pending; the next rollup (any consumer) takes them over with
``XAUTOCLAIM`` once they have been idle for ``min_idle_ms``, and the seen-ledger makes
the redelivery count nothing twice.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

import redis
from sqlalchemy.orm import Session

from controlplane.services import usage

log = logging.getLogger("nimbus.usage.rollup")

GROUP = "nimbus-usage-rollup"
Entry = tuple[str, Mapping[str, str]]


@dataclass
class RollupResult:
    read: int = 0
    counted: int = 0
    reclaimed: int = 0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def events_of(fields: Mapping[str, str] | Mapping[bytes, bytes]) -> list[dict[str, str]]:
    """The usage events of one stream entry, whether the client decodes responses or not; an
    entry whose ``events`` cannot be read counts as none (logged: a producer bug, not a load)."""
    fields = {_text(k): _text(v) for k, v in fields.items()}
    batch = fields.get("events")
    if batch is None:
        return [fields]
    try:
        events = json.loads(batch)
    except ValueError:
        log.error("unreadable usage stream entry (%d bytes of events): skipped", len(batch))
        return []
    return [e for e in events if isinstance(e, dict)]


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def ensure_group(r: redis.Redis, stream: str, group: str = GROUP) -> None:
    try:
        r.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _take(r: redis.Redis, stream: str, group: str, consumer: str, batch: int, min_idle_ms: int) -> tuple[list[Entry], int]:
    """Entries to process: a dead consumer's stale ones, then our own unacked, then new ones."""
    _, reclaimed, *_ = r.xautoclaim(stream, group, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=batch)
    entries = [e for e in reclaimed if e and e[1] is not None]
    if len(entries) < batch:
        for _, own in r.xreadgroup(group, consumer, {stream: "0"}, count=batch - len(entries)) or []:
            entries += [e for e in own if e[1]]
    if len(entries) < batch:
        for _, fresh in r.xreadgroup(group, consumer, {stream: ">"}, count=batch - len(entries)) or []:
            entries += fresh
    unique = {entry_id: fields for entry_id, fields in entries}
    return list(unique.items()), len(reclaimed)


def rollup(
    r: redis.Redis,
    session_scope: Callable[[], AbstractContextManager[Session]],
    stream: str,
    *,
    group: str = GROUP,
    consumer: str | None = None,
    batch: int = 500,
    max_batches: int = 20,
    min_idle_ms: int = 60_000,
) -> RollupResult:
    """Process up to ``max_batches`` batches; ``r`` must decode responses to ``str``."""
    consumer = consumer or consumer_name()
    ensure_group(r, stream, group)
    result = RollupResult()
    for _ in range(max_batches):
        entries, reclaimed = _take(r, stream, group, consumer, batch, min_idle_ms)
        result.reclaimed += reclaimed
        if not entries:
            break
        with session_scope() as session:
            result.counted += usage.ingest(session, [ev for _, fields in entries for ev in events_of(fields)])
        # Committed: only now may the stream forget them.
        ids = [entry_id for entry_id, _ in entries]
        r.xack(stream, group, *ids)
        r.xdel(stream, *ids)
        result.read += len(entries)
        if len(entries) < batch:
            break
    return result
