"""A loopback HTTP proxy (threads, one per connection) that forwards every request to an upstream
and sends its answer back; a subclass decides, once upstream has answered, whether and when the
answer goes back (``deliver``). Test doubles for a network between two real parts: a slow
cloud API, an answer lost after the server committed the request."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP_BY_HOP = ("content-length", "transfer-encoding", "connection", "content-encoding")


class ForwardingProxy:
    protocol_version = "HTTP/1.0"  # the handler's; HTTP/1.1 keeps connections alive

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> ForwardingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def deliver(self, path: str, body: bytes, answer: httpx.Response) -> bool:
        """Called once upstream has answered; may block. False: close the client's connection
        without the answer."""
        return True

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = proxy.protocol_version

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(self.command, proxy.upstream + self.path, content=body, headers=headers,
                                       timeout=30)
                if not proxy.deliver(self.path, body, answer):
                    self.close_connection = True  # answered upstream, lost on the way back
                    return
                try:
                    self.send_response(answer.status_code)
                    for k, v in answer.headers.items():
                        if k.lower() not in HOP_BY_HOP:
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(answer.content)))
                    self.end_headers()
                    self.wfile.write(answer.content)
                except OSError:
                    pass  # the client is gone (killed): nothing to answer

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        return Handler
