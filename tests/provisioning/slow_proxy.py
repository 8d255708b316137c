"""A loopback HTTP proxy in front of the moto server that holds back chosen responses.

Test double for "the cloud is slow to answer": the request reaches moto (the VM is
created) but its answer is held until released, so a worker can be killed in between.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


class SlowProxy:
    def __init__(self, upstream: str, hold_when: bytes) -> None:
        self.upstream = upstream
        self.hold_when = hold_when
        self.forwarded = threading.Event()  # a held request has reached upstream and been answered
        self.release = threading.Event()
        self.holding = True
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> SlowProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(self.command, proxy.upstream + self.path, content=body, headers=headers,
                                       timeout=30)
                if proxy.holding and proxy.hold_when in body:
                    proxy.forwarded.set()
                    proxy.release.wait(timeout=60)
                try:
                    self.send_response(answer.status_code)
                    for k, v in answer.headers.items():
                        if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(answer.content)))
                    self.end_headers()
                    self.wfile.write(answer.content)
                except OSError:
                    pass  # the client is gone (killed): nothing to answer

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        return Handler
