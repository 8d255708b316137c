"""Usage metering, producer side: one event per finished request into a Redis stream, through a
local append-only spool so that no answered request's usage is lost when the edge dies.

Write path (``record``, on the event loop, called before a response's final bytes are sent): the
event is encoded as one JSON line and appended to ``{state_dir}/usage-spool.jsonl`` with a single
``write()`` (``O_APPEND``), then queued in memory for the drainer. Once ``write()`` has returned
the line is in the kernel's page cache, which survives the process: a SIGKILL, an OOM kill or a
crash of the edge loses no event it has written, and the next start replays it.

Durability against a *machine* crash (power loss, kernel panic) needs ``fsync``: a background
group commit fsyncs the spool every ``fsync_s`` (default 0.2 s, ``usage_fsync_s``) when something
was written since the last one, off the event loop. So a machine crash loses at most the events
written in the last ``fsync_s`` plus the duration of one fsync (and whatever a disk that ignores
flushes drops); ``fsync_s <= 0`` turns the group commit off (process crashes stay covered).

Drain: one background task sends the queued events, up to ``ENTRY_EVENTS`` to a stream entry (a
JSON array in its ``events`` field), in one round trip per batch after a 5 ms linger, and once Redis has answered for every event in the file it is
truncated (one ``ftruncate`` per batch at most). Under steady load the file rotates instead: past ``rotate_bytes`` it is renamed to
``usage-spool.jsonl.<n>`` and a new one begun; a rotated file is deleted once every event in it is
written. If Redis fails, the in-memory queue is dropped (everything is in the files) and the drainer
replays the files in order, from the first event Redis has not acknowledged, until it catches up
with the writer; new events meanwhile are only appended. At start every file left by an earlier
process is replayed from its beginning, so a crash can repeat events (the part already written
to Redis; at most about ``rotate_bytes`` while Redis was up) but never lose one; consumers dedupe
on ``request_id`` (the control plane's roll-up does, ``controlplane/services/usage.py::ingest``).

With no Redis configured (standalone without metering) nothing drains: the files are the edge's
usage log, replayed to Redis by a later start that has one. If the spool cannot be written (a
full disk), the event is kept in memory and written to Redis directly, as before the spool.
The contract (field names) is in ``snapshot.py``'s docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from pathlib import Path

import msgspec

log = logging.getLogger("nimbus.edge.usage")

FIELDS = (
    "request_id", "tenant_id", "key_id", "variant_id", "model", "region", "replica_id", "prompt_tokens",
    "completion_tokens", "cached_tokens", "queue_ms", "ttft_ms", "duration_ms", "status", "http_status", "ts",
    "cache",
)
STATUSES = ("ok", "error", "client_abort", "rejected")
READ_CHUNK = 256 * 1024  # bytes of spool read per replay step


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


# Events per stream entry. An entry carries a JSON array of events (``events``): one XADD and one
# reply per hundred requests instead of per request, which was a fifth of the edge's CPU per
# request at its peak (pyinstrument: the XADD's encoding and the parsing of its reply).
ENTRY_EVENTS = 100


def encode_xadd(stream: bytes, fields: dict[bytes, bytes]) -> bytes:
    """RESP for ``XADD stream * field value ...``."""
    parts = [b"XADD", stream, b"*"]
    for name, value in fields.items():
        parts.append(name)
        parts.append(value)
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def encode_entries(stream: bytes, lines: list[bytes]) -> list[bytes]:
    """XADDs of ``lines`` (events encoded as JSON objects), ``ENTRY_EVENTS`` to an entry."""
    return [encode_xadd(stream, {b"events": b"[" + b",".join(lines[i:i + ENTRY_EVENTS]) + b"]"})
            for i in range(0, len(lines), ENTRY_EVENTS)]


def parse_lines(data: bytes) -> list[dict[str, str]]:
    """Events from whole spool lines; a torn or garbled line (a machine crash mid-write) is skipped."""
    events = []
    decode = msgspec.json.decode
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            ev = decode(line)
        except msgspec.DecodeError:
            log.warning("skipping an unreadable usage spool line (%d bytes)", len(line))
            continue
        if isinstance(ev, dict):
            events.append(ev)
    return events


def _read_chunk(path: Path, fd: int | None, offset: int, limit: int) -> tuple[bytes, int]:
    """Whole lines from ``offset`` up to ``limit`` (at most READ_CHUNK bytes), and the offset after
    them. ``fd`` (a duplicate, closed here) reads the file being written, whatever its name now."""
    own = fd is None
    if own:
        fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, min(READ_CHUNK, limit - offset), offset)
    finally:
        os.close(fd)
    if offset + len(data) >= limit:
        return data, offset + len(data)  # the end: a torn tail line is parsed (and skipped) as is
    cut = data.rfind(b"\n") + 1
    if cut == 0:  # one line longer than a chunk: take it whole
        return data, offset + len(data)
    return data[:cut], offset + cut


def _sync_files(fds: list[int], dir_fd_path: Path | None) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.fsync(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
    if dir_fd_path is not None:  # a file was created or renamed: make its name durable too
        with contextlib.suppress(OSError):
            dfd = os.open(dir_fd_path, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


class UsageRecorder:
    def __init__(self, redis_client, stream: str, spool_path: Path, batch_max: int = 500,
                 retry_s: float = 1.0, linger_s: float = 0.005, fsync_s: float = 0.2,
                 rotate_bytes: int = 256 * 1024) -> None:
        self.redis = redis_client
        self.stream = stream
        self.spool_path = Path(spool_path)
        self.batch_max = batch_max
        self.retry_s = retry_s
        # Wait this long after the first event of a batch for more to join it: at thousands of
        # requests/s one round trip per few events cost the edge a tenth of its CPU (py-spy).
        self.linger_s = linger_s
        self.fsync_s = fsync_s
        self.rotate_bytes = rotate_bytes
        # (the event's JSON line, seq of its file, offset after its line); only while the drainer
        # is caught up. The line is the spool's, so the drain encodes nothing again.
        self.pending: deque[tuple[bytes, int, int]] = deque()
        self.unspooled: deque[dict[str, str]] = deque()  # the spool could not be written
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._sync_task: asyncio.Task | None = None
        self._fd: int | None = None
        self._seq = 0  # the file being written; rotated ones are spool_path.<seq>
        self._size = 0
        self._sealed: dict[int, int] = {}  # seq -> size of rotated files not yet fully written to Redis
        self._ack = (0, 0)  # (seq, offset): everything before it is in Redis
        self._behind = False  # True: the drainer replays from the files, ``pending`` is unused
        self._dirty = False
        self._dir_dirty = False
        self._to_sync: list[int] = []
        self.written = 0  # events written to Redis
        self.spooled = 0  # events appended to the spool
        self.replayed = 0  # events written to Redis from the files
        self._warned_at = 0.0

    # ------------------------------------------------------------------ files

    def _sealed_path(self, seq: int) -> Path:
        return self.spool_path.with_name(f"{self.spool_path.name}.{seq:06d}")

    def _open(self) -> None:
        """Files left by an earlier process become rotated files (replayed first); a new one is begun."""
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        prefix = self.spool_path.name + "."
        for path in self.spool_path.parent.iterdir():
            tail = path.name[len(prefix):]
            if path.name.startswith(prefix) and tail.isdigit():
                self._sealed[int(tail)] = path.stat().st_size
        self._seq = max(self._sealed, default=0) + 1
        with contextlib.suppress(FileNotFoundError):
            if self.spool_path.stat().st_size > 0:
                os.rename(self.spool_path, self._sealed_path(self._seq))
                self._sealed[self._seq] = self._sealed_path(self._seq).stat().st_size
                self._seq += 1
        for seq, size in list(self._sealed.items()):
            if size == 0:
                self._sealed_path(seq).unlink(missing_ok=True)
                del self._sealed[seq]
        self._fd = os.open(self.spool_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fd).st_size
        self._ack = (min(self._sealed), 0) if self._sealed else (self._seq, self._size)
        # Without Redis nothing drains: no memory queue either (``_behind`` for good).
        self._behind = bool(self._sealed) or self.redis is None
        self._dir_dirty = True
        if self._sealed:
            log.warning("usage spool: %d bytes from an earlier run to replay", sum(self._sealed.values()))

    def _rotate(self) -> None:
        assert self._fd is not None
        os.rename(self.spool_path, self._sealed_path(self._seq))
        self._sealed[self._seq] = self._size
        self._to_sync.append(self._fd)  # fsynced and closed by the group commit
        self._seq += 1
        self._fd = os.open(self.spool_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = 0
        self._dir_dirty = True
        if self.fsync_s <= 0:
            self._flush_sync_list_now()

    def _flush_sync_list_now(self) -> None:
        for fd in self._to_sync:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._to_sync.clear()

    # ------------------------------------------------------------------ write path

    def record(self, event: dict[str, str]) -> None:
        """Append the event to the spool now (one write(); no fsync) and queue it for Redis."""
        fd = self._fd
        if fd is not None:
            encoded = msgspec.json.encode(event)
            line = encoded + b"\n"
            try:
                n = os.write(fd, line)
            except OSError as exc:
                n = -1
                self._spool_failed(exc)
            if n == len(line):
                self._size += n
                self.spooled += 1
                self._dirty = True
                if not self._behind:
                    self.pending.append((encoded, self._seq, self._size))
                if self._size >= self.rotate_bytes:
                    try:
                        self._rotate()
                    except OSError as exc:
                        self._spool_failed(exc)
                self._wake.set()
                return
            if n >= 0:  # a short write (disk full): the torn line stays the tail of a rotated file
                self._size += n
                self._spool_failed(OSError("short write"))
                with contextlib.suppress(OSError):
                    self._rotate()
        if len(self.unspooled) >= 100_000:  # no disk and no Redis for long: bounded memory
            self.unspooled.popleft()
        self.unspooled.append(event)
        self._wake.set()

    def _spool_failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned_at > 10:
            self._warned_at = now
            log.error("usage spool %s not writable (%r): usage kept in memory until Redis takes it",
                      self.spool_path, exc)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        try:
            self._open()
        except OSError as exc:
            self._fd = None
            self._spool_failed(exc)
        if self.redis is not None:
            self._task = asyncio.create_task(self._run())
        if self.fsync_s > 0 and self._fd is not None:
            self._sync_task = asyncio.create_task(self._sync_loop())

    async def stop(self) -> None:
        for task in (self._task, self._sync_task):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # Last chance to write what is queued; whatever is not written stays in the spool.
        if self.redis is not None and not self._behind:
            with contextlib.suppress(Exception):
                await self._drain_pending()
        if self.unspooled and self._fd is not None:
            rest = list(self.unspooled)
            self.unspooled.clear()
            for ev in rest:
                self.record(ev)
        self.pending.clear()
        if self._fd is not None:
            fds = [*self._to_sync, self._fd]
            self._to_sync, self._fd = [], None
            await asyncio.to_thread(_sync_files, fds, self.spool_path.parent)

    async def _sync_loop(self) -> None:
        """Group commit: one fsync per ``fsync_s`` at most, only when something was written."""
        while True:
            await asyncio.sleep(self.fsync_s)
            await self.sync()

    async def sync(self) -> None:
        fds, self._to_sync = self._to_sync, []
        if self._dirty and self._fd is not None:
            self._dirty = False
            fds.append(os.dup(self._fd))  # the fd may be rotated away meanwhile; its dup stays valid
        dir_path = self.spool_path.parent if self._dir_dirty else None
        self._dir_dirty = False
        if fds or dir_path is not None:
            await asyncio.to_thread(_sync_files, fds, dir_path)

    # ------------------------------------------------------------------ drain

    async def _run(self) -> None:
        while True:
            if self._behind:
                if not await self._replay():
                    await asyncio.sleep(self.retry_s)
                continue
            if not self.pending and not self.unspooled:
                self._wake.clear()
                await self._wake.wait()
                if self.linger_s > 0 and len(self.pending) < self.batch_max:
                    await asyncio.sleep(self.linger_s)
            if not await self._drain_pending():
                await asyncio.sleep(self.retry_s)

    async def _drain_pending(self) -> bool:
        while self.unspooled:
            batch = [self.unspooled[i] for i in range(min(self.batch_max, len(self.unspooled)))]
            if not await self._xadd_all([msgspec.json.encode(ev) for ev in batch]):
                return False
            for _ in batch:
                self.unspooled.popleft()
        while self.pending and not self._behind:
            pending = self.pending
            batch = [pending[i] for i in range(min(self.batch_max, len(pending)))]
            if not await self._xadd_all([line for line, _, _ in batch]):
                # Everything not yet in Redis is in the files: replay from there.
                self._behind = True
                pending.clear()
                return False
            for _ in batch:
                pending.popleft()
            _, seq, end = batch[-1]
            self._acked(seq, end)
        return True

    def _acked(self, seq: int, end: int) -> None:
        """Redis holds everything before (seq, end): forget rotated files behind it, and truncate the
        current file when it is all written (its events queued after ``end`` would be in ``pending``)."""
        self._ack = (seq, end)
        for s in [s for s in self._sealed if s < seq or (s == seq and end >= self._sealed[s])]:
            del self._sealed[s]
            with contextlib.suppress(OSError):
                self._sealed_path(s).unlink()
        if seq == self._seq and end >= self._size and not self.pending and self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
                self._size = 0
                self._ack = (self._seq, 0)

    async def _replay(self) -> bool:
        """One step of catching up from the files; False when Redis refused."""
        seq, off = self._ack
        if seq in self._sealed:
            path, fd, limit = self._sealed_path(seq), None, self._sealed[seq]
        elif seq == self._seq and self._fd is not None:
            path, fd, limit = self.spool_path, os.dup(self._fd), self._size
        else:  # a file gone (deleted by hand): go on with the next one
            later = sorted(s for s in self._sealed if s > seq)
            self._ack = (later[0], 0) if later else (self._seq, 0)
            return True
        if off >= limit:
            if fd is not None:
                os.close(fd)
            if seq == self._seq:  # caught up with the writer
                self._behind = False
                self._acked(seq, off)
                log.info("usage spool replayed (%d events so far)", self.replayed)
                return True
            self._acked(seq, limit)
            if self._ack[0] == seq:  # nothing acked it away (an empty tail): move on
                self._ack = (seq + 1, 0)
            return True
        data, end = await asyncio.to_thread(_read_chunk, path, fd, off, limit)
        # Decoded and encoded again, not passed on as read: a torn or garbled line is dropped here.
        events = [msgspec.json.encode(ev) for ev in parse_lines(data)]
        for start in range(0, len(events), self.batch_max):
            if not await self._xadd_all(events[start:start + self.batch_max]):
                # The part written is repeated on the next try (consumers dedupe by request_id).
                return False
        self.replayed += len(events)
        self._acked(seq, end)
        return True

    async def _xadd_all(self, lines: list[bytes]) -> bool:
        """One round trip for the whole batch (events as JSON lines), encoded here: redis-py's
        generic command packing costs more CPU than the rest of a request's metering."""
        if self.redis is None:
            return False
        if not lines:
            return True
        pool = self.redis.connection_pool
        conn = None
        try:
            conn = await pool.get_connection()
            entries = encode_entries(self.stream.encode(), lines)
            await conn.send_packed_command(b"".join(entries), check_health=False)
            for _ in entries:
                await conn.read_response()
        except Exception as exc:
            log.debug("usage xadd failed: %r", exc)
            if conn is not None:
                await conn.disconnect()
            return False
        finally:
            if conn is not None:
                await pool.release(conn)
        self.written += len(lines)
        return True
