"""Behaviour under load (CONFORMANCE.md §2, §8): one workload sized from the engine's own capacity
saturates it (a waiting queue, a full KV pool, retraction), and while it runs we check what the
edge and the autoscaler depend on:

* ``/health_generate`` answers 200 within 2 s while the engine is saturated and making progress
  (the edge drops replicas whose check fails; a busy replica is not a dead one);
* queue metrics are live while saturated (``num_queue_reqs`` > 0, ``/get_load`` agrees) and the
  running count never passes the running cap (``--max-running-requests``);
* a busy engine refuses ``/flush_cache`` (400);
* KV pressure retracts requests, and retracted requests still finish with their full output.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest

from tests.conformance.conftest import Engine, idle, prompt_ids

HEALTH_DEADLINE_S = 2.0


@dataclass
class Saturation:
    requests: int
    prompt_tokens: int
    max_new_tokens: int
    samples: list[dict] = field(default_factory=list)  # metrics + /get_load while saturated
    health: list[tuple[int, float, float]] = field(default_factory=list)  # (status, seconds, tokens during)
    flush_status: int | None = None
    results: list[tuple[int, dict]] = field(default_factory=list)  # (status, meta_info)
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)


def counters(engine: Engine) -> dict:
    m = engine.metrics()
    out = {name: m.value(f"sglang:{name}") for name in ("generation_tokens", "num_requests",
                                                         "num_retracted_requests")}
    queue = m.family("sglang:queue_time_seconds")
    out["queue_count"] = sum(s.value for s in queue.samples if s.name.endswith("_count"))
    out["queue_sum"] = sum(s.value for s in queue.samples if s.name.endswith("_sum"))
    return out


def sample(engine: Engine) -> dict:
    m = engine.metrics()
    load = engine.load()
    return {"running": m.value("sglang:num_running_reqs"), "queued": m.value("sglang:num_queue_reqs"),
            "token_usage": m.value("sglang:token_usage"), "retracted_gauge": m.value("sglang:num_retracted_reqs"),
            "generated": m.value("sglang:generation_tokens"),
            "load_waiting": sum(e["num_waiting_reqs"] for e in load), "at": time.monotonic()}


@pytest.fixture(scope="module")
def saturation(engine: Engine) -> Saturation:
    idle(engine)
    n = max(8, min(2 * engine.max_running, 256))
    p = 128
    # Three times the KV pool in total: admission (which reserves only part of each request's
    # future output) lets more in than can finish together, so decode runs the pool dry.
    m = max(64, min(int(3 * engine.capacity / n) - p, engine.context_length - p - 8))
    sat = Saturation(requests=n, prompt_tokens=p, max_new_tokens=m, before=counters(engine))
    lock = threading.Lock()

    def one(i: int) -> None:
        with engine.client(timeout=900) as c:
            r = c.post("/generate", json={"input_ids": prompt_ids(p), "sampling_params": {
                "max_new_tokens": m, "ignore_eos": True, "temperature": 0}})
        with lock:
            sat.results.append((r.status_code, r.json().get("meta_info", {}) if r.status_code == 200 else {}))

    pool = ThreadPoolExecutor(max_workers=n)
    futures = [pool.submit(one, i) for i in range(n)]
    try:
        deadline = time.monotonic() + 120
        while True:  # saturated: a queue has formed while requests run
            s = sample(engine)
            if s["queued"] and s["running"]:
                break
            assert time.monotonic() < deadline, f"the engine never queued under {n} requests: {s}"
            time.sleep(0.05)
        with engine.client(timeout=30) as c:
            sat.flush_status = c.post("/flush_cache").status_code
            for _ in range(3):
                sat.samples.append(sample(engine))
                before = sat.samples[-1]["generated"]
                began = time.monotonic()
                status = c.get("/health_generate").status_code
                took = time.monotonic() - began
                sat.samples.append(sample(engine))
                sat.health.append((status, took, sat.samples[-1]["generated"] - before))
        while not all(f.done() for f in futures):  # keep sampling until the workload drains
            sat.samples.append(sample(engine))
            time.sleep(0.1)
    finally:
        pool.shutdown(wait=True)
    for f in futures:
        f.result()
    idle(engine)
    sat.after = counters(engine)
    return sat


def test_health_generate_answers_within_two_seconds_while_saturated(saturation: Saturation):
    for status, took, tokens in saturation.health:
        assert status == 200, saturation.health
        assert took < HEALTH_DEADLINE_S, f"/health_generate took {took:.2f}s on a saturated engine"
        assert tokens > 0, "the engine made no progress during the check: not a saturation test"
    assert any(s["queued"] > 0 for s in saturation.samples[:6]), "probes were not taken while saturated"


def test_queue_metrics_are_live_while_saturated(engine: Engine, saturation: Saturation):
    busy = [s for s in saturation.samples if s["queued"] > 0]
    assert busy, "num_queue_reqs never rose above 0"
    assert max(s["load_waiting"] for s in saturation.samples) > 0, "/get_load never showed a waiting request"
    assert max(s["running"] for s in saturation.samples) <= engine.max_running
    assert max(s["token_usage"] for s in saturation.samples) > 0.5
    # Every request waited in the queue at least once; some of them for real.
    assert saturation.after["queue_count"] - saturation.before["queue_count"] >= saturation.requests
    assert saturation.after["queue_sum"] > saturation.before["queue_sum"]


def test_a_busy_engine_refuses_to_flush_its_cache(saturation: Saturation):
    assert saturation.flush_status == 400


def test_kv_pressure_retracts_and_retracted_requests_still_finish(saturation: Saturation):
    before, after = saturation.before, saturation.after
    if after["num_retracted_requests"] is not None:
        assert after["num_retracted_requests"] > (before["num_retracted_requests"] or 0), "no retraction"
    else:  # older SGLang: only the gauge of the last retraction
        assert max((s["retracted_gauge"] or 0) for s in saturation.samples) > 0, "no retraction"
    assert len(saturation.results) == saturation.requests
    for status, meta in saturation.results:
        assert status == 200
        assert meta["completion_tokens"] == saturation.max_new_tokens
        assert meta["finish_reason"]["type"] == "length"
    assert after["num_requests"] - before["num_requests"] == saturation.requests
    assert after["generation_tokens"] - before["generation_tokens"] >= saturation.requests * saturation.max_new_tokens


def test_the_engine_is_healthy_and_idle_after_the_load(engine: Engine):
    with httpx.Client(base_url=engine.url, headers=engine.headers, timeout=30) as c:
        assert c.get("/health_generate").status_code == 200
    assert engine.in_flight() == 0
