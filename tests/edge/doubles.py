"""A test-double engine (not the simulator): answers OpenAI chat/completions requests at once, and
fails the ones a test says it should, with any status. It lets the edge's blame logic be tested
against an engine failure that does not depend on what the simulator happens to get wrong today.

It runs on ``dataplane.httpserver`` in a thread with its own event loop, so a test can start a few
and count what each one saw."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from dataplane import httpserver
from dataplane.sim.process import free_port

Failing = Callable[[dict[str, Any]], int | None]


def never(_body: dict[str, Any]) -> int | None:
    return None


class DoubleEngine:
    """``fail(body)`` returns an HTTP status to fail the request with, or None to answer it."""

    def __init__(self, fail: Failing = never, served: str = "demo") -> None:
        self.fail = fail
        self.served = served
        self.port = free_port()
        self.seen: list[dict[str, Any]] = []  # generation request bodies, in arrival order
        self.failed = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: httpserver.HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self, pred: Callable[[dict[str, Any]], bool]) -> int:
        return sum(1 for body in list(self.seen) if pred(body))

    async def _handle(self, req: httpserver.Request) -> None:
        if req.path in ("/health", "/health_generate"):
            req.json(200, {"status": "ok"})
            return
        if req.path not in ("/v1/chat/completions", "/v1/completions"):
            req.json(404, {"error": {"message": "no route", "type": "not_found", "code": 404}})
            return
        body = msgspec.json.decode(req.body)
        self.seen.append(body)
        status = self.fail(body)
        if status is not None:
            self.failed += 1
            req.json(status, {"object": "error", "message": "test double failed the request", "code": status})
            return
        chat = req.path.endswith("chat/completions")
        n = int(body.get("max_tokens") or 4)
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
        if not body.get("stream"):
            choice = ({"index": 0, "message": {"role": "assistant", "content": "x " * n}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": "x " * n, "finish_reason": "length"})
            req.json(200, {"id": "d1", "object": "chat.completion" if chat else "text_completion", "created": 0,
                           "model": self.served, "choices": [choice], "usage": usage})
            return
        req.start_sse()
        for i in range(n):
            delta = {"index": 0, "delta": {"content": "x "}, "finish_reason": None} if chat else {
                "index": 0, "text": "x ", "finish_reason": None}
            req.sse({"id": "d1", "object": "chat.completion.chunk", "created": 0, "model": self.served,
                     "choices": [delta]})
            if i % 8 == 7:
                await asyncio.sleep(0)
        req.sse({"id": "d1", "object": "chat.completion.chunk", "created": 0, "model": self.served,
                 "choices": [], "usage": usage})
        req.sse_done()

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()

        async def start() -> None:
            self._server = await httpserver.serve(self._handle, "127.0.0.1", self.port)
            self._ready.set()

        loop.run_until_complete(start())
        loop.run_forever()
        loop.run_until_complete(self._server.shutdown(0.1))
        loop.close()

    def start(self) -> DoubleEngine:
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"double-engine-{self.port}")
        self._thread.start()
        if not self._ready.wait(10):
            raise TimeoutError("test double engine did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> DoubleEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()
