"""A client that goes away aborts its request (CONFORMANCE.md §7): the engine stops spending GPU time
on it. The edge relies on this when a tenant cancels or a stream's consumer dies."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import httpx

from tests.conformance.conftest import Engine, idle, prompt_ids

LONG = 4000  # tokens: far more than the time the test waits for


def wait_idle_after_disconnect(engine: Engine, generated_before: float, timeout: float = 15.0) -> float:
    """Seconds until nothing is in flight; asserts the request did not run to its end."""
    began = time.monotonic()
    idle(engine, timeout=timeout)
    spent = engine.metrics().value("sglang:generation_tokens") - generated_before
    assert spent < LONG, f"the aborted request produced {spent} tokens: it ran to the end"
    return time.monotonic() - began


def test_closing_a_stream_aborts_the_request(engine: Engine):
    idle(engine)
    m = engine.metrics()
    generated, aborted = m.value("sglang:generation_tokens"), m.value("sglang:num_aborted_requests")
    body = {"input_ids": prompt_ids(50), "stream": True,
            "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}
    with engine.client() as c, c.stream("POST", "/generate", json=body) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                assert json.loads(line[6:])["meta_info"]["finish_reason"] is None
                seen += 1
                if seen == 3:
                    break  # leaving the block closes the connection mid-stream
    assert engine.in_flight() <= 1
    wait_idle_after_disconnect(engine, generated)
    if aborted is not None:  # SGLang >= 0.5 exports the counter; the simulator does
        assert engine.metrics().value("sglang:num_aborted_requests") == aborted + 1


def test_disconnecting_from_a_non_streaming_request_aborts_it(engine: Engine):
    idle(engine)
    generated = engine.metrics().value("sglang:generation_tokens")
    url = urlparse(engine.url)
    payload = json.dumps({"input_ids": prompt_ids(50), "sampling_params": {"max_new_tokens": LONG,
                                                                           "ignore_eos": True}}).encode()
    auth = "".join(f"{k}: {v}\r\n" for k, v in engine.headers.items())
    head = (f"POST /generate HTTP/1.1\r\nHost: {url.hostname}\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((url.hostname, url.port or 80), timeout=10) as sock:
        sock.sendall(head + payload)
        deadline = time.monotonic() + 20
        while engine.in_flight() == 0:  # admitted and running before we leave
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
    # SGLang notices a gone non-streaming client when it next checks (every few seconds while
    # queued, at its next partial output while running); the bound leaves room for both.
    wait_idle_after_disconnect(engine, generated)


def test_abort_request_ends_a_waiting_client_with_finish_reason_abort(engine: Engine):
    idle(engine)
    out: list[httpx.Response] = []

    def call() -> None:
        with engine.client(timeout=120) as c:
            out.append(c.post("/generate", json={"input_ids": prompt_ids(30), "rid": "conformance-abort-me",
                                                 "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}))

    import threading

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 20
    while engine.in_flight() == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with engine.client() as c:
        assert c.post("/abort_request", json={"rid": "conformance-abort-me"}).status_code == 200
    t.join(30)
    assert out and out[0].status_code == 200, out and out[0].text
    meta = out[0].json()["meta_info"]
    assert meta["id"] == "conformance-abort-me" and meta["finish_reason"]["type"] == "abort"
    assert meta["completion_tokens"] < LONG
    idle(engine, timeout=10)
