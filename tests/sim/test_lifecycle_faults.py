"""Readiness, draining, fault injection and client disconnects, against real processes."""

import concurrent.futures
import time

import httpx
import pytest

from dataplane.sim.engine import CRASH_EXIT_CODE

FAST = ("--time-scale", "50")


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")


def health(url: str, timeout: float = 2.0) -> int:
    return httpx.get(url + "/health", timeout=timeout).status_code


def test_health_is_503_until_the_modelled_model_ready_time(start_sim):
    # Llama-3.1-70B on 4xH100: download + load + warm-up is ~150 s; at 60x that is ~2.5 s.
    sim = start_sim("--model-profile", "llama-3.1-70b", "--tp-size", "4", "--time-scale", "60",
                    ready_delay=None, wait=False)
    wait_for(lambda: _reachable(sim.url))
    assert health(sim.url) == 503
    assert httpx.post(sim.url + "/generate", json={"text": "x"}).status_code == 503
    began = time.monotonic()
    wait_for(lambda: health(sim.url) == 200, timeout=10)
    assert time.monotonic() - began > 0.5


def _reachable(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=1)
        return True
    except httpx.TransportError:
        return False


def test_drain_finishes_in_flight_and_refuses_new(start_sim):
    sim = start_sim("--time-scale", "5")
    # ~0.6 s of stream: long enough to drain in the middle of it even on a busy machine.
    body = {"text": "drain me", "stream": True, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    with httpx.Client(base_url=sim.url, timeout=30) as c, c.stream("POST", "/generate", json=body) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        drained = c.post("/_sim/drain").json()
        assert drained["draining"] is True and drained["in_flight"] == 1
        assert c.get("/health").status_code == 503
        assert c.post("/generate", json={"text": "new"}).status_code == 503
        rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert '"length":400' in rest[-2]


def test_fault_endpoint_health_fail_and_clear(shared_sim):
    url = shared_sim.url
    assert httpx.post(url + "/_sim/faults", json={"health": "fail"}).json()["health"] == "fail"
    try:
        assert health(url) == 503
        assert httpx.get(url + "/health_generate").status_code == 503
        assert httpx.get(url + "/_sim/faults").json()["health"] == "fail"
    finally:
        httpx.delete(url + "/_sim/faults")
    assert health(url) == 200
    assert httpx.post(url + "/_sim/faults", json={"bogus": 1}).status_code == 400


def test_hang_stalls_tokens_and_health_until_cleared(shared_sim):
    url = shared_sim.url
    httpx.post(url + "/_sim/faults", json={"hang": True})
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.get(url + "/health", timeout=0.5)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}, timeout=0.5)
        # A request that arrives during the hang is held, not lost: it finishes once cleared.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(httpx.post, url + "/generate",
                               json={"text": "held", "sampling_params": {"max_new_tokens": 3}}, timeout=10)
            time.sleep(0.3)
            assert not held.done()
            httpx.delete(url + "/_sim/faults")
            assert held.result().json()["meta_info"]["completion_tokens"] == 3
    finally:
        httpx.delete(url + "/_sim/faults")
    assert health(url) == 200
    stats = httpx.get(url + "/_sim/stats").json()
    assert stats["running"] == stats["waiting"] == 0
    assert stats["radix_evictable"] == stats["radix_tokens"]  # the aborted requests left no locks behind


def test_slowdown_stretches_latency(shared_sim):
    # 600 tokens is ~90 ms of scheduled time at 50x: long enough that CPU contention on a
    # shared machine does not blur the 5x factor.
    body = {"text": "slow", "sampling_params": {"max_new_tokens": 600, "ignore_eos": True}}
    with httpx.Client(base_url=shared_sim.url, timeout=30) as client:

        def e2e() -> float:
            began = time.monotonic()
            client.post("/generate", json=body).raise_for_status()
            return time.monotonic() - began

        normal = e2e()
        client.post("/_sim/faults", json={"slowdown": 5.0})
        try:
            slow = e2e()
        finally:
            client.delete("/_sim/faults")
    assert slow > 3 * normal


def test_crash_mid_stream_after_n_tokens(start_sim):
    sim = start_sim(*FAST, "--fault-crash-after-tokens", "5")
    body = {"text": "crash", "stream": True, "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}}
    events = []
    with pytest.raises(httpx.TransportError):
        with httpx.stream("POST", sim.url + "/generate", json=body, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
    assert 1 <= len(events) <= 5 and "[DONE]" not in events[-1]
    assert sim.proc.wait(timeout=5) == CRASH_EXIT_CODE


def test_fault_flags_at_startup(start_sim):
    sim = start_sim(*FAST, "--fault-health-fail", "--fault-refuse", "--fault-slowdown", "2", wait=False)
    wait_for(lambda: _reachable(sim.url))
    assert health(sim.url) == 503
    faults = httpx.get(sim.url + "/_sim/faults").json()
    assert faults == {"health": "fail", "hang": False, "crash_after_tokens": None, "slowdown": 2.0, "refuse": True}


def test_client_disconnect_aborts_the_request(start_sim):
    sim = start_sim("--time-scale", "1", "--enable-metrics")
    body = {"text": "long", "stream": True, "sampling_params": {"max_new_tokens": 100000, "ignore_eos": True}}
    with httpx.stream("POST", sim.url + "/generate", json=body, timeout=10) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        assert httpx.get(sim.url + "/_sim/stats").json()["running"] == 1
    wait_for(lambda: httpx.get(sim.url + "/_sim/stats").json()["running"] == 0, timeout=3)
    stats = httpx.get(sim.url + "/_sim/stats").json()
    assert stats["used_tokens"] == stats["radix_tokens"]  # nothing private left: KV released
    assert stats["radix_evictable"] == stats["radix_tokens"]  # and nothing locked
