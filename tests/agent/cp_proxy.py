"""A test proxy in front of a control plane (the real one or the stand-in) that a test can pause:
it forwards, answers 503 to everything (an overloaded or restarting API), or hangs every request
until the client gives up (an API process under SIGSTOP, a database lock). It can also forward a
request and then lose its answer (``drop_answers``): the control plane handled it, the client never
hears back, as when a register queued in a stopped API's backlog.

It records every request's arrival (monotonic time, path, what it did with it)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from tests.live_server import read_body, send_json, serve

FORWARD, FAIL, HANG = "forward", "fail", "hang"


@dataclass(frozen=True)
class Seen:
    at: float
    path: str
    outcome: str  # forwarded | failed | hung | dropped


class ControlPlaneProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.mode = FORWARD
        self.drop_answers: dict[str, int] = {}  # path suffix → how many more answers to lose after forwarding
        self.lock = threading.Lock()
        self.seen: list[Seen] = []

    def set_mode(self, mode: str) -> float:
        """Switch mode; returns the monotonic time of the switch."""
        self.mode = mode
        return time.monotonic()

    def requests(self, suffix: str = "", since: float = 0.0, outcome: str | None = None) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path.endswith(suffix) and s.at >= since
                    and (outcome is None or s.outcome == outcome)]

    def _record(self, at: float, path: str, outcome: str) -> None:
        with self.lock:
            self.seen.append(Seen(at, path, outcome))

    async def _until_client_leaves(self, receive) -> None:
        with_timeout = asyncio.wait_for(receive(), 120)  # http.disconnect once the client times out
        try:
            await with_timeout
        except TimeoutError:
            pass

    async def __call__(self, scope, receive, send) -> None:
        path = scope["path"]
        if path == "/healthz":
            await send_json(send, 200, b'{"ok": true}')
            return
        at = time.monotonic()
        body = await read_body(receive)
        mode = self.mode
        if mode == HANG:
            self._record(at, path, "hung")
            await self._until_client_leaves(receive)
            return
        if mode == FAIL:
            self._record(at, path, "failed")
            await send_json(send, 503, b'{"detail": "control plane unavailable (test proxy)"}')
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k.lower() in (b"authorization",
                                                                                           b"content-type")}
        async with httpx.AsyncClient(timeout=30) as http:
            resp = await http.post(self.upstream + path, content=body, headers=headers)
        drop = next((suffix for suffix, left in self.drop_answers.items() if left > 0 and path.endswith(suffix)), None)
        if drop is not None:
            self.drop_answers[drop] -= 1
            self._record(at, path, "dropped")
            await self._until_client_leaves(receive)
            return
        self._record(at, path, "forwarded")
        await send_json(send, resp.status_code, resp.content)



@contextmanager
def proxy_to(upstream: str) -> Iterator[tuple[ControlPlaneProxy, str]]:
    proxy = ControlPlaneProxy(upstream)
    with serve(proxy, lifespan="off") as url:
        yield proxy, url
