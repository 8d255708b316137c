"""Blame the right party: an engine failure the request itself causes (the same failure on a second
replica) goes back to its client as a 4xx, opens no breaker, is not tried a third time, and costs
other tenants nothing; a failure only one replica has still opens that replica's breaker.

The engines are test doubles (``tests/edge/doubles.py``) that fail whatever a test marks, with a
5xx: the edge must hold for any engine failure, not just the ones the simulator has today."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest

from tests.edge.conftest import make_key, standalone_config
from tests.edge.doubles import DoubleEngine

POISON = "poison-pill"


def poisoned(body) -> int | None:
    return 500 if body.get("user") == POISON else None


def metric(edge, name: str, label: str = "") -> float:
    total = 0.0
    for line in httpx.get(edge.url + "/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def two_tenant_edge(edge_factory, urls, **settings):
    a, b = make_key("poisoner"), make_key("bystander")
    cfg = standalone_config(urls, [{"name": "poisoner", "keys": [{"dev_key": a}]},
                                   {"name": "bystander", "keys": [{"dev_key": b}]}],
                            settings={"policy": "round_robin", "health_interval_s": 600, **settings})
    return edge_factory(cfg, redis_url="none"), a, b


def chat(client: httpx.Client, key: str, *, user: str = "ok", stream: bool = False) -> tuple[int, float, dict]:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "user": user,
            "stream": stream}
    t0 = time.monotonic()
    r = client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
    elapsed = time.monotonic() - t0
    return r.status_code, elapsed, (r.json() if r.headers.get("content-type", "").startswith("application/json")
                                    else {})


def test_poison_requests_get_422_open_no_breaker_and_cost_others_nothing(edge_factory):
    with DoubleEngine(poisoned) as e1, DoubleEngine(poisoned) as e2:
        edge, bad, good = two_tenant_edge(edge_factory, [e1.url, e2.url])
        with httpx.Client(base_url=edge.url, timeout=30) as client:
            for _ in range(10):
                chat(client, good)
            baseline = [chat(client, good)[1] for _ in range(30)]

            # The poisoner floods (plain and streamed requests) while the bystander keeps working.
            poison_results: list[tuple[int, float, dict]] = []

            def flood() -> None:
                with httpx.Client(base_url=edge.url, timeout=30) as c:
                    for i in range(24):
                        poison_results.append(chat(c, bad, user=POISON, stream=bool(i % 2)))

            flooder = threading.Thread(target=flood)
            flooder.start()
            during = []
            while flooder.is_alive() or len(during) < 30:
                status, elapsed, _ = chat(client, good)
                assert status == 200
                during.append(elapsed)
            flooder.join()
            after = [chat(client, good) for _ in range(20)]

        assert len(poison_results) == 24
        for status, elapsed, body in poison_results:
            assert status == 422, body
            assert body["error"]["code"] == "engine_rejected_request"
            assert body["error"]["type"] == "invalid_request_error"
            assert elapsed < 2.0
        # Tried on exactly two replicas each, never a third time.
        assert e1.count(lambda b: b.get("user") == POISON) + e2.count(lambda b: b.get("user") == POISON) == 48
        # Breakers closed: the bystander is still served by both replicas, fast, with no error.
        assert all(status == 200 for status, _, _ in after)
        served_after = [e1.count(lambda b: b.get("user") == "ok"), e2.count(lambda b: b.get("user") == "ok")]
        assert min(served_after) >= 20, served_after
        assert metric(edge, "nimbus_edge_breaker_open") == 0
        assert metric(edge, "nimbus_edge_request_faults_total", 'kind="http_500"') == 24
        base_p50 = statistics.median(baseline)
        assert statistics.median(during) < 3 * base_p50 + 0.02, (base_p50, statistics.median(during))
        assert max(during) < 1.0  # before: every breaker open, the bystander waited 10 s
        assert max(e for _, e, _ in after) < 1.0


def test_with_one_replica_a_poison_request_fails_at_once_and_blames_nobody(edge_factory):
    with DoubleEngine(poisoned) as engine:
        edge, bad, good = two_tenant_edge(edge_factory, [engine.url])
        with httpx.Client(base_url=edge.url, timeout=60) as client:
            for _ in range(8):  # more than breaker_failures
                status, elapsed, body = chat(client, bad, user=POISON)
                assert status == 502, body  # unverifiable with one replica: the engine failed, not us
                assert body["error"]["code"] == "upstream_error"
                assert elapsed < 2.0  # before: 30 s in the queue, then 503
            status, elapsed, _ = chat(client, good)
        assert status == 200
        assert elapsed < 1.0
        assert engine.count(lambda b: b.get("user") == POISON) == 8  # once each
        assert metric(edge, "nimbus_edge_breaker_open") == 0


def test_a_replica_that_fails_alone_still_opens_its_breaker(edge_factory):
    with DoubleEngine(lambda body: 500) as broken, DoubleEngine() as healthy:
        edge, _, good = two_tenant_edge(edge_factory, [broken.url, healthy.url])
        with httpx.Client(base_url=edge.url, timeout=30) as client:
            results = [chat(client, good) for _ in range(30)]
        assert all(status == 200 for status, _, _ in results)
        # Charged once the healthy replica served what the broken one failed: open after 5.
        assert 5 <= len(broken.seen) <= 6  # 6: a half-open probe, had the test outlasted the 10 s cooldown
        assert metric(edge, "nimbus_edge_breaker_open") == 1
        assert metric(edge, "nimbus_edge_request_faults_total") == 0


@pytest.mark.parametrize("status", [400, 422])
def test_an_engine_4xx_reaches_the_client_in_openai_shape_once(edge_factory, status):
    with DoubleEngine(lambda b: status if b.get("user") == POISON else None) as e1, \
            DoubleEngine(lambda b: status if b.get("user") == POISON else None) as e2:
        edge, bad, _ = two_tenant_edge(edge_factory, [e1.url, e2.url])
        with httpx.Client(base_url=edge.url, timeout=30) as client:
            for _ in range(6):
                code, _, body = chat(client, bad, user=POISON)
                assert code == status
                assert body["error"]["message"] == "test double failed the request"
                assert body["error"]["code"] == "engine_rejected_request"
        assert len(e1.seen) + len(e2.seen) == 6  # never retried
        assert metric(edge, "nimbus_edge_breaker_open") == 0


def test_the_same_503_on_two_replicas_is_a_503_and_opens_no_breaker(edge_factory):
    with DoubleEngine(lambda b: 503 if b.get("user") == POISON else None) as e1, \
            DoubleEngine(lambda b: 503 if b.get("user") == POISON else None) as e2:
        edge, bad, good = two_tenant_edge(edge_factory, [e1.url, e2.url])
        with httpx.Client(base_url=edge.url, timeout=30) as client:
            for _ in range(8):
                code, _, body = chat(client, bad, user=POISON)
                assert code == 503
                assert body["error"]["code"] == "engine_unavailable"
            assert chat(client, good)[0] == 200
        assert metric(edge, "nimbus_edge_breaker_open") == 0
