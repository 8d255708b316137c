"""The edge's HTTP front (``dataplane.httpserver`` + ``dataplane.edge.app``): body limits in OpenAI's
error shape, keep-alive, graceful shutdown with a stream in flight, and write flow control."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import openai
import pytest

from dataplane import httpserver
from dataplane.sim.process import SimProcess
from tests.edge.conftest import make_key, standalone_config


def test_oversized_body_gets_413_in_openai_shape(edge_factory, sims):
    key = make_key("a")
    cfg = standalone_config([s.url for s in sims], [{"name": "a", "keys": [{"dev_key": key}]}],
                            settings={"max_body_bytes": 2048})
    edge = edge_factory(cfg, redis_url="none")
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x" * 5000}])
    assert exc.value.status_code == 413
    assert exc.value.body["code"] == "request_too_large"
    # The same edge still answers a normal request afterwards.
    ok = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ok.usage.completion_tokens == 2


def test_keep_alive_reuses_one_connection_for_many_requests(edge_factory, sims):
    key = make_key("a")
    edge = edge_factory(standalone_config([s.url for s in sims], [{"name": "a", "keys": [{"dev_key": key}]}]),
                        redis_url="none")
    with httpx.Client(base_url=edge.url, headers={"authorization": f"Bearer {key}"}) as client:
        ports = set()
        for _ in range(5):
            r = client.post("/v1/completions", json={"model": "demo", "prompt": "x", "max_tokens": 1},
                            extensions={"trace": lambda name, info: ports.add(
                                info["return_value"].get_extra_info("sockname"))
                                if name == "connection.connect_tcp.complete" else None})
            assert r.status_code == 200, r.text
            assert r.headers["connection"] == "keep-alive"
    assert len(ports) == 1


def test_sigterm_lets_a_stream_in_flight_finish(edge_factory):
    key = make_key("a")
    # Real-time simulator (no time scaling), so the stream is still running when the signal lands.
    with SimProcess(served_model_name="demo", ready_delay=0.0) as sim:
        edge = edge_factory(standalone_config([sim.url], [{"name": "a", "keys": [{"dev_key": key}]}]),
                            redis_url="none")
        client = openai.OpenAI(base_url=edge.url + "/v1", api_key=key, max_retries=0, timeout=30)
        stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=120, stream=True)
        chunks = iter(stream)
        assert next(chunks).choices
        edge.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        time.sleep(0.2)
        # New connections are refused while the stream in flight still runs to its end.
        with pytest.raises(httpx.ConnectError):
            httpx.get(edge.url + "/health", timeout=2)
        rest = [c for c in chunks if c.choices and c.choices[0].delta.content]
        streamed_after_signal = time.monotonic() - signalled
        assert len(rest) >= 115
        assert streamed_after_signal > 0.3
        assert edge.proc.wait(timeout=10) == 0


def test_idle_keep_alive_connection_is_closed_and_slow_reader_pauses_the_writer():
    async def scenario() -> tuple[bytes, int, int]:
        paused = []

        async def handler(req: httpserver.Request) -> None:
            if req.path == "/big":
                req.conn.start_chunked(200, b"application/octet-stream")
                chunk = b"x" * 65536
                for _ in range(200):  # 12.5 MiB: far more than the socket buffers hold
                    req.conn.write_chunk(chunk)
                    if req.conn._paused:
                        paused.append(1)
                    await req.conn.drain()
                req.conn.end_chunked()
            else:
                req.send(200, b"ok")

        server = await httpserver.serve(handler, "127.0.0.1", 0, httpserver.ServerOptions(keep_alive_s=0.3))
        port = server.server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"ok")
        t0 = time.monotonic()
        assert await reader.read(100) == b""  # the server closes the idle connection
        idle_closed_after = time.monotonic() - t0
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
        writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.5)  # read nothing for a while: the server must stop writing
        before = server.busy()
        received = 0
        while True:
            data = await reader.read(1 << 20)
            if not data:
                break
            received += len(data)
            if data.endswith(b"0\r\n\r\n"):
                break
        writer.close()
        await server.shutdown(1.0)
        assert idle_closed_after < 2.0
        return head, before, received if paused else -1

    head, busy_while_paused, received = asyncio.run(scenario())
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert busy_while_paused == 1
    assert received >= 200 * 65536  # everything arrived once the reader caught up, and paused at least once


def test_pipelined_requests_are_answered_in_order():
    async def scenario() -> bytes:
        async def handler(req: httpserver.Request) -> None:
            if req.path == "/slow":
                await asyncio.sleep(0.1)
            req.send(200, req.path.encode())

        server = await httpserver.serve(handler, "127.0.0.1", 0)
        port = server.server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /fast HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await reader.read()
        writer.close()
        await server.shutdown(1.0)
        return data

    data = asyncio.run(scenario())
    assert data.index(b"/slow") < data.index(b"/fast")
    assert data.count(b"HTTP/1.1 200") == 2


