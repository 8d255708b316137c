"""Helpers for the hostile-input tests: raw sockets, response parsing, edges behind test doubles."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from dataplane.edge.process import EdgeProcess
from tests.edge.conftest import make_key, standalone_config
from tests.edge.doubles import DoubleEngine

STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def statuses(data: bytes) -> list[int]:
    return [int(m) for m in STATUS.findall(data)]


def connect(port: int, source: str | None = None, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if source:
        sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool, float]:
    """Everything the server sends until it closes, whether it closed within ``timeout``, and when."""
    t0 = time.monotonic()
    data = b""
    sock.settimeout(0.05)
    while time.monotonic() - t0 < timeout:
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return data, True, time.monotonic() - t0
        if not chunk:
            return data, True, time.monotonic() - t0
        data += chunk
    return data, False, time.monotonic() - t0


def send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send what the server will still take (it may close early, e.g. after a 431)."""
    with contextlib.suppress(OSError):
        sock.sendall(data)


def json_error(data: bytes) -> dict[str, Any]:
    """The OpenAI-shaped error object of the first response in ``data``."""
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.search(rb"content-length: (\d+)", head, re.I)
    assert m, head
    obj = json.loads(body[: int(m.group(1))])
    err = obj["error"]
    assert set(err) >= {"message", "type", "param", "code"}, obj
    return err


class FuzzEdge:
    """An edge in front of two test-double engines, with short timeouts so hostile connections end fast."""

    SETTINGS = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "keep_alive_s": 1.0, "send_timeout_s": 1.0,
                "health_interval_s": 600, "unauth_rate_per_s": 100000, "unauth_burst": 100000,
                "max_body_bytes": 256 * 1024, "policy": "round_robin"}

    def __init__(self, tmp: Path, **settings: Any) -> None:
        self.key = make_key("fuzz")
        self.engines = [DoubleEngine().start(), DoubleEngine().start()]
        cfg = standalone_config([e.url for e in self.engines], [{"name": "fuzz", "keys": [{"dev_key": self.key}]}],
                                settings={**self.SETTINGS, **settings})
        self.edge = EdgeProcess(cfg, state_dir=tmp, redis_url="none", log_path=tmp / "edge.log").start()
        self.port = self.edge.port
        self.url = self.edge.url

    def close(self) -> None:
        self.edge.close()
        for e in self.engines:
            e.stop()

    def serves_normally(self) -> None:
        """The edge is alive and answers a normal request, plain and streamed."""
        assert self.edge.proc is not None and self.edge.proc.poll() is None
        with httpx.Client(base_url=self.url, timeout=10,
                          headers={"authorization": f"Bearer {self.key}"}) as c:
            r = c.post("/v1/chat/completions", json={"model": "demo", "max_tokens": 3,
                                                     "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 3
            r = c.post("/v1/completions", json={"model": "demo", "prompt": "x", "max_tokens": 2, "stream": True})
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text
            assert c.get("/health").status_code == 200


@contextlib.contextmanager
def fuzz_edge(tmp: Path, **settings: Any) -> Iterator[FuzzEdge]:
    edge = FuzzEdge(tmp, **settings)
    try:
        yield edge
    finally:
        edge.close()


def request(method: bytes, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes = b"",
            version: bytes = b"HTTP/1.1") -> bytes:
    return (method + b" " + path + b" " + version + b"\r\n"
            + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n" + body)
