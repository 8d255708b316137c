"""A loopback HTTP proxy in front of the moto server that holds back chosen responses.

Test double for "the cloud is slow to answer": the request reaches moto (the VM is
created) but its answer is held until released, so a worker can be killed in between.
"""

from __future__ import annotations

import threading

import httpx

from tests.forwarding_proxy import ForwardingProxy


class SlowProxy(ForwardingProxy):
    def __init__(self, upstream: str, hold_when: bytes) -> None:
        super().__init__(upstream)
        self.hold_when = hold_when
        self.forwarded = threading.Event()  # a held request has reached upstream and been answered
        self.release = threading.Event()
        self.holding = True

    def stop(self) -> None:
        self.release.set()
        super().stop()

    def deliver(self, path: str, body: bytes, answer: httpx.Response) -> bool:
        if self.holding and self.hold_when in body:
            self.forwarded.set()
            self.release.wait(timeout=60)
        return True
