"""The playground's server-side proxy: one chat completion streamed through the edge.

The browser never sees an API key: it posts a message to the console, and the console calls the
edge with the session's own inference key, passing the OpenAI SSE bytes through unbuffered.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator

import httpx

from controlplane.db.types import utcnow

# A key minted seconds ago may not have reached the edge yet (it polls the control plane's
# snapshot every few seconds); within this age a 401 is retried instead of shown.
PROPAGATION_GRACE = dt.timedelta(seconds=15)
_RETRY_EVERY_S = 0.5
MAX_TOKENS_LIMIT = 1024


def sse_error(message: str) -> bytes:
    """An error in the same shape the edge uses once a stream has started."""
    return f"data: {json.dumps({'error': {'message': message, 'type': 'console_error'}})}\n\ndata: [DONE]\n\n".encode()


def chat_body(model: str, message: str, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": message}],
        "max_tokens": max(1, min(max_tokens, MAX_TOKENS_LIMIT)),
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_chat(edge_url: str, key: str, key_created_at: dt.datetime, body: dict,
                      *, transport: httpx.AsyncBaseTransport | None = None) -> AsyncIterator[bytes]:
    url = edge_url.rstrip("/") + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}
    timeout = httpx.Timeout(connect=5.0, read=120.0, write=10.0, pool=5.0)
    async with httpx.AsyncClient(timeout=timeout, transport=transport) as client:
        while True:
            try:
                async with client.stream("POST", url, json=body, headers=headers) as resp:
                    if resp.status_code == 401 and utcnow() - key_created_at < PROPAGATION_GRACE:
                        await asyncio.sleep(_RETRY_EVERY_S)
                        continue
                    if resp.status_code != 200:
                        yield sse_error(_edge_error(resp.status_code, await resp.aread()))
                        return
                    async for chunk in resp.aiter_raw():
                        yield chunk
                    return
            except httpx.HTTPError as exc:
                yield sse_error(f"the edge could not be reached ({type(exc).__name__})")
                return


def _edge_error(status: int, raw: bytes) -> str:
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw.decode(errors="replace")[:200] or "no detail"
    return f"the edge answered {status}: {message}"
