"""Engine states the suite can only produce on an engine it launches itself (CONFORMANCE.md §2):
starting, graceful exit on SIGTERM, API-key gating. They run against simulators started here; with
``NIMBUS_ENGINE_URL`` set they are skipped, since a remote node cannot be restarted or signalled
from a test (check those by hand with the commands in CONFORMANCE.md)."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from dataplane.sim.process import SimProcess
from tests.conformance.conftest import ENGINE_URL, SIM_ARGS, prompt_ids

pytestmark = pytest.mark.skipif(bool(ENGINE_URL), reason="launches and signals its own engine process")


def status(url: str, path: str, **kw) -> int | None:
    """The status code, or None while nothing listens (SGLang's HTTP server starts after the load)."""
    try:
        return httpx.get(url + path, timeout=5, **kw).status_code
    except httpx.TransportError:
        return None


def test_a_starting_engine_is_not_healthy_until_it_is_ready():
    sim = SimProcess(served_model_name="starting", extra_args=SIM_ARGS, ready_delay=2.0).launch()
    try:
        began = time.monotonic()
        seen = set()
        while time.monotonic() - began < 1.2:
            seen.add((status(sim.url, "/health"), status(sim.url, "/health_generate")))
            time.sleep(0.05)
        # Before ready: refused (not listening yet) or 503 (listening, warm-up not done); never 200.
        assert seen and all(h in (None, 503) and g in (None, 503) for h, g in seen), seen
        sim.wait_healthy(10)
        assert time.monotonic() - began >= 1.9
        assert status(sim.url, "/health_generate") == 200
    finally:
        sim.stop()


def test_sigterm_turns_health_503_finishes_in_flight_work_then_exits():
    sim = SimProcess(served_model_name="exiting", extra_args=SIM_ARGS, ready_delay=0.0).start()
    events: list[str] = []
    first = threading.Event()

    def stream() -> None:
        body = {"input_ids": prompt_ids(30), "stream": True, "sampling_params": {"max_new_tokens": 300,
                                                                                 "ignore_eos": True}}
        with httpx.stream("POST", sim.url + "/generate", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first.set()

    try:
        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(20)
        sim.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # SGLang's graceful exit: health checks fail at once so routers stop sending...
        assert status(sim.url, "/health") == 503 and status(sim.url, "/health_generate") == 503
        # ...but requests are still served (its tokenizer manager gates nothing), in flight or new.
        r = httpx.post(sim.url + "/generate", json={"input_ids": prompt_ids(10),
                                                    "sampling_params": {"max_new_tokens": 3}}, timeout=30)
        assert r.status_code == 200
        t.join(30)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["meta_info"]["finish_reason"]["type"] == "length"
        sim.proc.wait(10)  # and it exits once nothing is left
    finally:
        sim.stop()


def test_api_key_gates_everything_but_health_and_metrics():
    sim = SimProcess(served_model_name="keyed", extra_args=[*SIM_ARGS, "--api-key", "conformance-key"],
                     ready_delay=0.0).start()
    try:
        body = {"input_ids": prompt_ids(5), "sampling_params": {"max_new_tokens": 1}}
        assert httpx.post(sim.url + "/generate", json=body, timeout=30).status_code == 401
        ok = httpx.post(sim.url + "/generate", json=body, timeout=30,
                        headers={"Authorization": "Bearer conformance-key"})
        assert ok.status_code == 200
        assert status(sim.url, "/health") == 200 and status(sim.url, "/metrics") == 200
        assert status(sim.url, "/v1/models") == 401
    finally:
        sim.stop()
