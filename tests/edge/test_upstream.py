"""The edge's own upstream HTTP client against a real simulator replica."""

from __future__ import annotations

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
