"""The edge's HTTP front (``dataplane.httpserver`` + ``dataplane.edge.app``): body limits in OpenAI's
error shape, keep-alive, graceful shutdown with a stream in flight, and write flow control."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time

import httptools
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




def _sse_content(body: bytes) -> tuple[str, int]:
    """(concatenated delta content, number of [DONE] events) of a de-chunked SSE body."""
    text, done = [], 0
    for event in body.split(b"\n\n"):
        if event == b"data: [DONE]":
            done += 1
        elif event.startswith(b"data: "):
            for choice in json.loads(event[6:]).get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text), done


@pytest.fixture
def fast_sim():
    """A replica that streams tokens far faster than real time, so a long answer outruns the
    socket buffers between the edge and a client that does not read."""
    with SimProcess(served_model_name="demo", extra_args=["--time-scale", "2000"], ready_delay=0.0) as sim:
        yield sim


def test_a_reader_that_falls_behind_gets_every_token_once_and_in_order(edge_factory, fast_sim):
    """Tokens go from the engine to the client's socket without waking the request's task until the
    client backs up; then they queue and drain in order. A client with a tiny receive buffer that
    reads nothing for a while must still get exactly the engine's text."""
    key = make_key("slow")
    edge = edge_factory(standalone_config([fast_sim.url], [{"name": "slow", "keys": [{"dev_key": key}]}],
                                          context_length=32768))
    body = {"model": "demo", "messages": [{"role": "user", "content": "tell me everything"}], "max_tokens": 16000,
            "ignore_eos": True, "seed": 7, "stream": True}
    with httpx.stream("POST", fast_sim.url + "/v1/chat/completions", json=body, timeout=30) as resp:
        expected, _ = _sse_content(resp.read())
    assert len(expected.split()) >= 15000

    raw = json.dumps(body).encode()
    got: list[bytes] = []
    parser = httptools.HttpResponseParser(type("Sink", (), {"on_body": lambda self, b: got.append(b)})())
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
    sock.connect(("127.0.0.1", edge.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer %s\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (key.encode(), len(raw), raw))
    time.sleep(1.0)  # read nothing: the edge's socket buffer fills and its writes pause mid-stream
    sock.settimeout(30)
    while True:
        data = sock.recv(1024)
        if not data:
            break
        parser.feed_data(data)
        if b"".join(got[-2:]).endswith(b"data: [DONE]\n\n"):
            break
    sock.close()
    content, done = _sse_content(b"".join(got))
    assert done == 1
    assert content == expected
