"""The edge's own upstream HTTP client against a real simulator replica."""

from __future__ import annotations

import asyncio
import json

import pytest

from dataplane.edge.upstream import UpstreamClient, UpstreamError
from tests.edge.conftest import port_is_closed

BODY = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()
HEADERS = {"Content-Type": "application/json"}


async def post(client, url, body=BODY, **kw):
    return await client.post(url, "/v1/chat/completions", body, HEADERS, connect_timeout=2, first_byte_timeout=10, **kw)


async def test_keep_alive_connections_are_reused(sims):
    client = UpstreamClient()
    for _ in range(3):
        resp = await post(client, sims[0].url)
        data = json.loads(await resp.read(10))
        assert resp.status == 200 and data["usage"]["completion_tokens"] == 3
        resp.close()
    pool = client._pools[sims[0].url][0]
    assert len(pool.idle) == 1  # one connection served all three
    client.close()


async def test_stream_chunks_arrive_and_early_close_aborts(sims):
    client = UpstreamClient()
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
                       "stream": True}).encode()
    resp = await post(client, sims[0].url, body)
    chunks = []
    async for chunk in resp.iter_chunks(5):
        chunks.append(chunk)
        if len(chunks) == 2:
            break
    resp.close()  # mid-body: the connection is aborted, never pooled
    assert b"data:" in b"".join(chunks)
    assert client._pools[sims[0].url][0].idle == []
    client.close()


async def test_stale_pooled_connection_is_retried_transparently(sims):
    client = UpstreamClient()
    resp = await post(client, sims[0].url)
    await resp.read(10)
    resp.close()
    pool = client._pools[sims[0].url][0]
    pool.idle[0].transport.close()  # the server side went away while the connection sat idle
    pool.idle[0].closed = False  # ...and we have not noticed yet
    resp = await post(client, sims[0].url)
    assert resp.status == 200
    await resp.read(10)
    resp.close()
    client.close()


async def test_unreachable_replica_raises_upstream_error():
    client = UpstreamClient()
    with pytest.raises(UpstreamError):
        await post(client, f"http://127.0.0.1:{port_is_closed()}")


class ScriptedServer:
    """A raw HTTP server that answers with a chunked body written piece by piece on the test's
    command, so the timing of each chunk is the test's to choose."""

    def __init__(self) -> None:
        self.writer: asyncio.StreamWriter | None = None
        self.connected = asyncio.Event()

    async def __aenter__(self) -> ScriptedServer:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        if self.writer is not None:
            self.writer.close()
        self.server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        self.writer = writer
        self.connected.set()

    async def chunk(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await self.writer.drain()
        await asyncio.sleep(0.02)  # let the client's loop parse it


async def test_sink_takes_bytes_while_the_reader_waits_and_refusals_keep_their_order():
    taken: list[bytes] = []

    def sink(data: bytes) -> bool:
        if data.startswith(b"refuse"):
            return False
        taken.append(data)
        return True

    async with ScriptedServer() as server:
        client = UpstreamClient()
        resp = await post(client, server.url)
        resp.set_sink(sink)
        read: list[bytes] = []

        async def reader() -> None:
            async for chunk in resp.iter_chunks(5):
                read.append(chunk)
                await asyncio.sleep(0.1)  # the reader is busy: what arrives now must queue behind

        task = asyncio.create_task(reader())
        await server.chunk(b"a")
        await server.chunk(b"refuse-1")
        await server.chunk(b"b")  # arrives while the reader holds refuse-1: queued, not sunk
        await asyncio.sleep(0.2)
        await server.chunk(b"c")  # the reader waits again: sunk
        assert taken == [b"a", b"c"]
        assert read == [b"refuse-1", b"b"]
        server.writer.write(b"0\r\n\r\n")
        await task
        resp.close()
        client.close()


async def test_idle_timeout_counts_from_the_last_byte_even_when_the_sink_took_it():
    async with ScriptedServer() as server:
        client = UpstreamClient()
        resp = await post(client, server.url)
        resp.set_sink(lambda data: True)
        loop = asyncio.get_running_loop()

        async def read_all() -> None:
            async for _ in resp.iter_chunks(0.3):
                pass

        task = asyncio.create_task(read_all())
        t0 = loop.time()
        for i in range(5):  # 0.5 s of sunk chunks, 0.12 s apart: longer than the timeout in all
            if i:
                await asyncio.sleep(0.1)
            await server.chunk(b"x")
            last = loop.time()
        with pytest.raises(TimeoutError):
            await task
        assert loop.time() - t0 > 0.45  # not timed out while bytes kept coming
        assert 0.25 < loop.time() - last < 0.6  # but soon after they stopped
        resp.close()
        client.close()
