"""Usage metering, producer side: one event per finished request into a Redis stream.

Events are queued in memory and written by one background task with pipelined ``XADD``s (so the
request path never waits on Redis). If Redis fails, the batch goes to an append-only spool file
under the state dir; the spool is replayed in order before anything newer once Redis answers,
and truncated only after every line in it was written. With no Redis configured at all (standalone
without metering) the same file is simply the edge's usage log. File writes run off the event loop.
The contract (field names) is in
``snapshot.py``'s docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections import deque
from pathlib import Path

log = logging.getLogger("nimbus.edge.usage")

FIELDS = (
    "request_id", "tenant_id", "key_id", "variant_id", "model", "region", "replica_id", "prompt_tokens",
    "completion_tokens", "cached_tokens", "queue_ms", "ttft_ms", "duration_ms", "status", "http_status", "ts",
)
STATUSES = ("ok", "error", "client_abort", "rejected")


def make_event(**values: object) -> dict[str, str]:
    """All contract fields, as strings; unknown ones empty."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"not usage fields: {sorted(unknown)}")
    out = {}
    for name in FIELDS:
        v = values.get(name)
        if v is None:
            out[name] = ""
        elif isinstance(v, float):
            out[name] = f"{v:.6f}" if name == "ts" else f"{v:.3f}"
        else:
            out[name] = str(v)
    return out


def encode_xadd(stream: bytes, event: dict[str, str]) -> bytes:
    """RESP for ``XADD stream * field value ...``."""
    parts = [b"XADD", stream, b"*"]
    for name, value in event.items():
        parts.append(name.encode())
        parts.append(value.encode())
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class UsageRecorder:
    def __init__(self, redis_client, stream: str, spool_path: Path, batch_max: int = 500,
                 retry_s: float = 1.0, linger_s: float = 0.005) -> None:
        self.redis = redis_client
        self.stream = stream
        self.spool_path = spool_path
        self.batch_max = batch_max
        self.retry_s = retry_s
        # Wait this long after the first event of a batch for more to join it: at thousands of
        # requests/s one round trip per few events cost the edge a tenth of its CPU (py-spy).
        self.linger_s = linger_s
        self.pending: deque[dict[str, str]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.written = 0
        self.spooled = 0

    def record(self, event: dict[str, str]) -> None:
        self.pending.append(event)
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # Last chance to write; whatever cannot be written is spooled, never dropped.
        if self.pending and not (await self._replay_spool() and await self._flush_pending()):
            await self._spool_pending()

    async def _run(self) -> None:
        while True:
            if not self.pending and (self.redis is None or not self._spool_has_data()):
                self._wake.clear()
                await self._wake.wait()
                if self.linger_s > 0 and len(self.pending) < self.batch_max:
                    await asyncio.sleep(self.linger_s)
            if self.redis is None:
                # No Redis configured (standalone without metering): the spool file is the usage log.
                await self._spool_pending(durable=False)
                continue
            ok = await self._replay_spool() and await self._flush_pending()
            if not ok:
                await self._spool_pending()
                await asyncio.sleep(self.retry_s)

    async def _spool_pending(self, durable: bool = True) -> None:
        if not self.pending:
            return
        events = list(self.pending)
        self.pending.clear()
        # File I/O (and fsync) off the event loop: a slow disk must not stall every stream.
        await asyncio.to_thread(self._spool, events, durable)
        if durable:
            log.warning("redis unavailable: spooled %d usage events to %s", len(events), self.spool_path)

    def _spool_has_data(self) -> bool:
        try:
            return self.spool_path.stat().st_size > 0
        except OSError:
            return False

    def _spool(self, events: list[dict[str, str]], durable: bool = True) -> None:
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        with self.spool_path.open("a") as f:
            f.write("".join(json.dumps(ev) + "\n" for ev in events))
            f.flush()
            if durable:
                os.fsync(f.fileno())
        self.spooled += len(events)

    async def _xadd_all(self, events: list[dict[str, str]]) -> bool:
        """One round trip for the whole batch, encoded here (redis-py's generic command packing
        costs more CPU than the rest of a request's metering)."""
        if self.redis is None:
            return False
        pool = self.redis.connection_pool
        conn = None
        try:
            conn = await pool.get_connection()
            stream = self.stream.encode()
            await conn.send_packed_command(b"".join(encode_xadd(stream, ev) for ev in events), check_health=False)
            for _ in events:
                await conn.read_response()
        except Exception as exc:
            log.debug("usage xadd failed: %r", exc)
            if conn is not None:
                await conn.disconnect()
            return False
        finally:
            if conn is not None:
                await pool.release(conn)
        self.written += len(events)
        return True

    async def _flush_pending(self) -> bool:
        while self.pending:
            batch = [self.pending[i] for i in range(min(self.batch_max, len(self.pending)))]
            if not await self._xadd_all(batch):
                return False
            for _ in batch:
                self.pending.popleft()
        return True

    async def _replay_spool(self) -> bool:
        if not self._spool_has_data():
            return True
        lines = self.spool_path.read_text().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        for start in range(0, len(events), self.batch_max):
            if not await self._xadd_all(events[start:start + self.batch_max]):
                # Keep what was not written yet (a crash here may repeat the written part; consumers
                # dedupe by request_id).
                rest = events[start:]
                tmp = self.spool_path.with_suffix(".tmp")
                tmp.write_text("".join(json.dumps(ev) + "\n" for ev in rest))
                os.replace(tmp, self.spool_path)
                return False
        self.spool_path.write_text("")
        log.info("replayed %d spooled usage events", len(events))
        return True
