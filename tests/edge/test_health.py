"""Health checks that never amplify load: slow is not dead, dead leaves at once, and the last
region degrades to its best replicas instead of failing closed (issue 19, part 1).

The verdicts and the router's tiers are pure and tested as such; the end-to-end tests run a real
edge process against real simulators, whose ``/health_generate`` behaves like SGLang's."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from dataplane.edge.health import ProbeResult, judge
from dataplane.edge.router import (
    DEGRADED_FAILING_REGION,
    DEGRADED_UNHEALTHY,
    PROBE_DEAD,
    PROBE_FAILED,
    PROBE_OK,
    PROBE_SLOW,
)
from dataplane.sim.process import sim_fleet
from tests.edge.conftest import SIM_ARGS, make_key, metric, sdk_client, standalone_config
from tests.edge.test_routing import catalog, make_router, route

# ---- the verdict of one probe ------------------------------------------------------------------

STARTED, NOW = 100.0, 100.5


@pytest.mark.parametrize(("result", "last_progress", "inflight", "verdict", "busy_since"), [
    (ProbeResult(connected=False), 100.2, 3, PROBE_DEAD, float("-inf")),  # nothing listens: gone, whatever it did before
    (ProbeResult(True, health_status=200, generate_status=200), -1.0, 0, PROBE_OK, float("-inf")),
    (ProbeResult(True, health_status=200), 99.9, 2, PROBE_OK, float("-inf")),  # vouched for by traffic: no generation sent
    (ProbeResult(True, health_status=503), 100.2, 2, PROBE_FAILED, float("-inf")),  # the engine itself says so
    (ProbeResult(True, health_status=200, generate_status=503), -1.0, 0, PROBE_FAILED, float("-inf")),
    (ProbeResult(True, timed_out=True), 100.2, 0, PROBE_SLOW, float("-inf")),  # it produced output while we waited
    (ProbeResult(True, timed_out=True), 90.0, 4, PROBE_SLOW, float("-inf")),  # busy, progressed 10 s ago: slow
    (ProbeResult(True, timed_out=True), 60.0, 4, PROBE_FAILED, float("-inf")),  # busy but stalled past health_stall_s: hung
    (ProbeResult(True, timed_out=True), 99.0, 0, PROBE_FAILED, float("-inf")),  # idle and silent: the probe decides
    (ProbeResult(True, timed_out=True), float("-inf"), 3, PROBE_SLOW, 95.0),  # busy 5 s, no first byte yet
    (ProbeResult(True, timed_out=True), float("-inf"), 3, PROBE_FAILED, 60.0),  # busy 40 s, never a byte
])
def test_a_probe_verdict_tells_slow_from_hung_from_dead(result, last_progress, inflight, verdict, busy_since):
    assert judge(result, STARTED, NOW, last_progress, inflight, stall_s=30.0, busy_since=busy_since) == verdict


# ---- the router's tiers ------------------------------------------------------------------------


def ids(cands):
    return {c.replica.id for c in cands}


def test_the_last_region_degrades_to_its_reachable_replicas_instead_of_failing_closed():
    cat = catalog(n=3, regions=("only",), max_running=10)
    router = make_router("round_robin", health_failures_to_down=2)
    replicas = list(cat.replicas.values())
    router.mark_health("rep0", PROBE_DEAD)
    for _ in range(2):
        router.mark_health("rep1", PROBE_FAILED)
        router.mark_health("rep2", PROBE_FAILED)
    cands = router.eligible(cat, replicas, 0.0)
    assert ids(cands) == {"rep1", "rep2"} and {c.degraded for c in cands} == {DEGRADED_UNHEALTHY}
    # Readiness asks strictly: nothing here should look healthy to DNS.
    assert router.eligible(cat, replicas, 0.0, degrade=False) == []
    # Breakers still open, and a request's own exclusions still hold, in the fallback too.
    for _ in range(router.settings.breaker_failures):
        router.breaker("rep1").on_failure(0.0)
    assert ids(router.eligible(cat, replicas, 1.0)) == {"rep2"}
    assert router.eligible(cat, replicas, 1.0, exclude={"rep2"}) == []
    # A dead replica never comes back through the fallback; one probe that connects again does it,
    # and as the one healthy replica of a region that is still failing it comes first.
    router.mark_health("rep0", PROBE_OK)
    cands = router.eligible(cat, replicas, 1.0)
    assert ids(cands) == {"rep0"} and cands[0].degraded == DEGRADED_FAILING_REGION


def test_a_failing_only_region_keeps_serving_from_its_healthy_half():
    cat = catalog(n=4, regions=("only",), max_running=10)
    router = make_router("round_robin", health_failures_to_down=1, region_fail_fraction=0.5)
    router.mark_health("rep0", PROBE_FAILED)
    router.mark_health("rep1", PROBE_FAILED)
    cands = router.eligible(cat, list(cat.replicas.values()), 0.0)
    assert ids(cands) == {"rep2", "rep3"} and {c.degraded for c in cands} == {DEGRADED_FAILING_REGION}


def test_a_failing_region_still_gives_way_to_a_healthy_one():
    cat = catalog(n=4, regions=("a", "b"), max_running=10)  # rep0, rep2 in a; rep1, rep3 in b
    router = make_router("round_robin", health_failures_to_down=1, region_fail_fraction=0.5)
    router.mark_health("rep0", PROBE_FAILED)
    cands = router.eligible(cat, list(cat.replicas.values()), 0.0)
    assert ids(cands) == {"rep1", "rep3"} and {c.degraded for c in cands} == {""}


def test_a_slow_replica_stays_eligible_but_scores_its_probe_timeout_until_it_answers_in_time():
    cat = catalog(n=2, max_running=100)
    router = make_router(prefill_ms_per_token=0.01, decode_ms_per_running=0.0, health_timeout_s=5.0)
    for _ in range(5):
        router.mark_health("rep0", PROBE_SLOW)
    cands = {c.replica.id: c for c in router.eligible(cat, list(cat.replicas.values()), 0.0)}
    assert set(cands) == {"rep0", "rep1"} and router.health_of("rep0").healthy
    assert cands["rep0"].bias_ms >= 5000 and cands["rep1"].bias_ms == 0
    assert {route(router, cat, f"q{i}")[0].replica.id for i in range(4)} == {"rep1"}
    router.mark_health("rep0", PROBE_OK)
    assert router.health_of("rep0").slow_penalty_ms == 0


# ---- end to end: a real edge and real simulators ------------------------------------------------


def tier_health(edge) -> tuple[int, dict]:
    resp = httpx.get(edge.url + "/health/models/demo", timeout=5)
    return resp.status_code, resp.json()["tiers"]["bf16"]


def test_a_replica_slow_under_load_stays_in_rotation(edge_factory):
    """Once three streams run on the only replica, every engine step is made slower than the
    edge's probe timeout, so each /health_generate that is sent times out; but the engine keeps
    streaming to the edge's clients. Before passive health, two such timeouts took the replica out
    and its clients got 503s."""
    key = make_key("slow")
    with sim_fleet(1, served_model_name="demo", extra_args=["--time-scale", "1"], ready_delay=0.0) as fleet:
        cfg = standalone_config([fleet[0].url], [{"name": "a", "keys": [{"dev_key": key}]}],
                                settings={"health_interval_s": 0.2, "health_timeout_s": 0.3,
                                          "health_failures_to_down": 2})
        edge = edge_factory(cfg, redis_url="none")
        streaming = threading.Semaphore(0)
        chunks: list[int] = []
        errors: list[BaseException] = []

        def client() -> None:
            try:
                stream = sdk_client(edge, key).chat.completions.create(
                    model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=200, stream=True,
                    extra_body={"ignore_eos": True})
                count = 0
                for ch in stream:
                    if ch.choices and ch.choices[0].delta.content:
                        count += 1
                        if count == 1:
                            streaming.release()
                chunks.append(count)
            except BaseException as exc:
                errors.append(exc)
                streaming.release()

        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        for _ in threads:
            assert streaming.acquire(timeout=30)
        httpx.post(fleet[0].url + "/_sim/faults", json={"slowdown": 60.0}).raise_for_status()
        seen = []
        deadline = time.monotonic() + 4.0  # twenty probe rounds
        while time.monotonic() < deadline:
            seen.append(tier_health(edge)[1]["healthy_replicas"])
            time.sleep(0.1)
        httpx.delete(fleet[0].url + "/_sim/faults").raise_for_status()  # let the streams finish
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert chunks == [200, 200, 200]
        assert seen and min(seen) == 1, seen
        # A late request is still served by it, and it was never taken out.
        assert sdk_client(edge, key).completions.create(model="demo", prompt="x", max_tokens=1).choices
        assert metric(edge, "nimbus_edge_degraded_dispatches_total") == 0


def test_a_dead_replica_leaves_at_the_first_probe(edge_factory):
    key = make_key("dead")
    with sim_fleet(2, served_model_name="demo", extra_args=SIM_ARGS, ready_delay=0.0) as fleet:
        # Ten failed probes would be needed if death were counted like a failed probe (5 s here).
        cfg = standalone_config([s.url for s in fleet], [{"name": "a", "keys": [{"dev_key": key}]}],
                                settings={"health_interval_s": 0.5, "health_failures_to_down": 10,
                                          "policy": "round_robin"})
        for replica, region in zip(cfg["models"][0]["tiers"][0]["replicas"], ("east", "west"), strict=True):
            replica["region"] = region  # (one region half down would count as failing for readiness)
        edge = edge_factory(cfg, redis_url="none")
        assert tier_health(edge)[1]["healthy_replicas"] == 2
        fleet[1].kill()
        killed = time.monotonic()
        while tier_health(edge)[1]["healthy_replicas"] != 1:
            assert time.monotonic() - killed < 3.0, "the dead replica stayed in rotation"
            time.sleep(0.05)
        retries = metric(edge, "nimbus_edge_retries_total")
        for _ in range(4):  # round robin would send half of these to the dead replica
            assert sdk_client(edge, key).completions.create(model="demo", prompt="x", max_tokens=1).choices
        assert metric(edge, "nimbus_edge_retries_total") == retries


def test_the_last_region_whose_replicas_all_fail_their_probes_still_serves(edge_factory):
    key = make_key("last")
    with sim_fleet(2, served_model_name="demo", extra_args=SIM_ARGS, ready_delay=0.0) as fleet:
        cfg = standalone_config([s.url for s in fleet], [{"name": "a", "keys": [{"dev_key": key}]}],
                                settings={"health_interval_s": 0.2, "health_failures_to_down": 1})
        edge = edge_factory(cfg, redis_url="none")
        for sim in fleet:
            httpx.post(sim.url + "/_sim/faults", json={"health": "fail"}).raise_for_status()
        deadline = time.monotonic() + 10
        while tier_health(edge)[1]["healthy_replicas"] != 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # DNS hears the truth: the model is not healthy here...
        assert tier_health(edge)[0] == 503
        # ...but the clients that still reach this region are served by the best of what is left.
        c = sdk_client(edge, key)
        for _ in range(3):
            assert c.completions.create(model="demo", prompt="x", max_tokens=2).usage.completion_tokens == 2
        stream = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3, stream=True, extra_body={"ignore_eos": True})
        assert sum(1 for ch in stream if ch.choices and ch.choices[0].delta.content) == 3
        assert metric(edge, 'nimbus_edge_degraded_dispatches_total{model="demo",reason="unhealthy"}') == 4
