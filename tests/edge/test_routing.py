"""Routing policies, the capacity guard, health/region filtering, prefix index, breakers."""

from __future__ import annotations

import pytest

from dataplane.edge.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, RetryBudget
from dataplane.edge.catalog import Catalog
from dataplane.edge.policies import RouteRequest, TtftModel, make_policy
from dataplane.edge.prefix import PrefixIndex, block_hashes
from dataplane.edge.router import Router
from dataplane.edge.settings import EdgeSettings


def catalog(n=3, regions=("r1",), max_running=4, max_total_tokens=100_000, rtt=None):
    replicas = [{"id": f"rep{i}", "pool_id": "p", "variant_id": "v", "region": regions[i % len(regions)],
                 "url": f"http://h{i}", "state": "ready", "max_running_requests": max_running,
                 "max_total_tokens": max_total_tokens} for i in range(n)]
    return Catalog.from_snapshot({
        "etag": "x", "tenants": [], "keys": [],
        "models": [{"name": "m", "variants": [{"id": "v", "tier": "bf16", "context_length": 8192}]}],
        "pools": [{"id": "p", "variant_id": "v", "kind": "warm"}], "replicas": replicas,
        "regions": [{"name": r, "rtt_ms": (rtt or {}).get(r)} for r in regions]})


def make_router(policy="predicted_ttft", **settings):
    s = EdgeSettings(policy=policy, prefix_block_chars=16, chars_per_token=4.0, **settings)
    index = PrefixIndex(s.prefix_block_chars, s.chars_per_token, s.prefix_ttl_s, s.prefix_index_blocks)
    model = TtftModel(s.prefill_ms_per_token, s.decode_ms_per_running)
    return Router(s, make_policy(policy, index, model, profile=s.routing_profile), index, model)


def route(router, cat, text, now=0.0, exclude=frozenset()):
    req = RouteRequest(block_hashes(text, router.settings.prefix_block_chars), len(text) // 4, len(text))
    cands = router.eligible(cat, list(cat.replicas.values()), now, exclude)
    decision = router.choose(req, cands, now)
    if decision is None:
        return None, None
    return decision, router.dispatch(cat, decision, req, req.prompt_tokens + 10, now)


def test_block_hashes_share_exactly_the_common_prefix():
    a = block_hashes("x" * 64 + "tail-a" * 10, 16)
    b = block_hashes("x" * 64 + "tail-b" * 10, 16)
    assert a[:4] == b[:4] and a[4] != b[4]
    assert block_hashes("short", 16) == []


def test_prefix_index_is_bounded_by_kv_capacity_and_corrected_by_reports():
    idx = PrefixIndex(block_chars=16, chars_per_token=4.0)
    # 64 tokens of KV = 16 blocks of 16 chars
    first = block_hashes("a" * 160, 16)
    idx.record("r", 64, first, now=0)
    assert idx.matched_blocks("r", first, now=1) == 10
    idx.record("r", 64, block_hashes("b" * 160, 16), now=2)
    assert idx.blocks_held("r") == 16
    # LRU took the deepest blocks of the older prompt first; its root survives
    assert 0 < idx.matched_blocks("r", first, now=3) < 10
    assert idx.matched_blocks("r", first, now=10_000) == 0  # TTL
    # The engine found less cached than predicted: the replica's LRU shrinks
    idx.correct("r", predicted_share=0.8, reported_share=0.1)
    assert idx._replicas["r"].capacity < 16
    for _ in range(200):
        idx.correct("r", predicted_share=0.5, reported_share=0.5)
    assert idx._replicas["r"].capacity == 16


def test_prefix_index_follows_the_calibrated_characters_per_token():
    """The index sizes each replica's LRU in characters; when prompts turn out to carry more
    characters per token than assumed, the same KV holds more characters, and the index must not
    forget prefixes the engine still has."""
    idx = PrefixIndex(block_chars=16, chars_per_token=4.0)
    a, b = block_hashes("a" * 160, 16), block_hashes("b" * 160, 16)  # 10 blocks each
    idx.record("r", 64, a, now=0)  # 64 tokens x 4 chars = 16 blocks
    idx.record("r", 64, b, now=1)
    assert idx.matched_blocks("r", a, now=2) < 10  # part of `a` forgotten at 4 chars/token
    idx.calibrate(5.0)  # 64 tokens x 5 chars = 20 blocks
    assert idx._replicas["r"].nominal_capacity == 20
    idx.record("r", 64, a, now=3)
    idx.record("r", 64, b, now=4)
    assert idx.matched_blocks("r", a, now=5) == 10 and idx.matched_blocks("r", b, now=5) == 10
    # What the engine's feedback taught (a smaller effective cache) survives the rescale.
    idx.correct("r", predicted_share=0.9, reported_share=0.1)
    learned = idx._replicas["r"].capacity / 20
    idx.calibrate(4.0)
    assert idx._replicas["r"].nominal_capacity == 16
    assert abs(idx._replicas["r"].capacity / 16 - learned) < 0.1
    assert idx.blocks_held("r") <= idx._replicas["r"].capacity
    idx.calibrate(4.01)  # a change under 2% is ignored
    assert idx.chars_per_token == 4.0


def test_predicted_ttft_keeps_a_prefix_on_its_replica_until_backlog_outweighs_it():
    cat = catalog(n=2, max_running=100)
    router = make_router(prefill_ms_per_token=1.0, decode_ms_per_running=0.0)
    system = "S" * 4000  # ~1000 tokens
    d1, _ = route(router, cat, system + "user one")
    d2, _ = route(router, cat, system + "user two")
    assert d2.replica.id == d1.replica.id and d2.predicted_cached_tokens >= 990
    # a different tenant's prefix goes to the other (idle) replica
    d3, _ = route(router, cat, "T" * 4000 + "x")
    assert d3.replica.id != d1.replica.id
    # pile uncached prefill on the first replica: the shared prefix now costs less elsewhere
    router.load(d1.replica.id).pending_prefill_tokens += 5000
    d4, _ = route(router, cat, system + "user three")
    assert d4.replica.id != d1.replica.id


def test_predicted_ttft_prefers_low_rtt_region_all_else_equal():
    cat = catalog(n=2, regions=("near", "far"), rtt={"near": 1.0, "far": 80.0})
    router = make_router()
    d, _ = route(router, cat, "hello world " * 10)
    assert d.replica.region == "near"


def test_capacity_guard_and_release():
    cat = catalog(n=2, max_running=2)
    router = make_router("predicted_ttft")
    tickets = [route(router, cat, "same prompt " * 20)[1] for _ in range(4)]
    # despite the shared prefix, no replica went past its 2 slots
    assert sorted(router.load(r).inflight for r in ("rep0", "rep1")) == [2, 2]
    assert route(router, cat, "more")[0] is None  # everyone full -> queue
    router.release(tickets[0], True, 1.0, reported=(100, 0))
    assert route(router, cat, "more")[0].replica.id == tickets[0].replica.id
    assert router.load("rep0").pending_prefill_tokens >= 0


def test_round_robin_and_least_load():
    cat = catalog(n=3, max_running=10)
    rr = make_router("round_robin")
    assert [route(rr, cat, "p")[0].replica.id for _ in range(6)] == ["rep0", "rep1", "rep2"] * 2
    ll = make_router("least_load")
    ll.load("rep0").inflight = 5
    ll.load("rep1").inflight = 1
    assert route(ll, cat, "p")[0].replica.id == "rep2"


def test_unhealthy_replicas_and_failing_regions_drop_out():
    cat = catalog(n=4, regions=("a", "b"), max_running=10)  # rep0,rep2 in a; rep1,rep3 in b
    router = make_router("round_robin", health_failures_to_down=2, region_fail_fraction=0.5)
    router.mark_health("rep0", "failed")
    assert {c.replica.id for c in router.eligible(cat, list(cat.replicas.values()), 0)} == {"rep0", "rep1", "rep2", "rep3"}
    assert router.mark_health("rep0", "failed") is True  # second failure flips it
    # half of region a fails -> the whole region drops out
    assert {c.replica.id for c in router.eligible(cat, list(cat.replicas.values()), 0)} == {"rep1", "rep3"}
    router.mark_health("rep0", "ok")
    assert len(router.eligible(cat, list(cat.replicas.values()), 0)) == 4


def test_breaker_opens_probes_and_closes():
    br = CircuitBreaker(failures_to_open=3, cooldown_s=10)
    for t in range(3):
        assert br.allows(t)
        br.on_failure(t)
    assert br.state == OPEN and not br.allows(5)
    assert br.allows(13) and br.state == HALF_OPEN
    br.on_dispatch()
    assert not br.allows(13.1)  # one probe at a time
    br.on_failure(14)
    assert br.state == OPEN and not br.allows(20)
    assert br.allows(25)
    br.on_dispatch()
    br.on_success()
    assert br.state == CLOSED and br.allows(25)


def test_open_breaker_removes_replica_from_candidates():
    cat = catalog(n=2, max_running=10)
    router = make_router("round_robin", breaker_failures=1)
    _, ticket = route(router, cat, "p")
    router.release(ticket, False, now=0.0)
    ids = {c.replica.id for c in router.eligible(cat, list(cat.replicas.values()), 1.0)}
    assert ticket.replica.id not in ids and len(ids) == 1


def test_retry_budget_caps_retries_in_an_outage():
    budget = RetryBudget(ratio=0.1, min_per_s=1.0, burst=5)
    granted = 0
    for i in range(1000):  # 1000 requests in 10 s, every one failing
        now = i * 0.01
        budget.on_request(now)
        granted += budget.try_spend(now)
    assert granted <= 5 + 1000 * 0.1 + 10 * 1.0 + 1
    assert granted >= 50


def test_ttft_model_calibrates():
    model = TtftModel(prefill_ms_per_token=0.01, decode_ms_per_running=0)
    for _ in range(200):
        model.observe(rtt_ms=1.0, backlog_tokens=1000, observed_ttft_ms=51.0)
    assert abs(model.prefill_ms_per_token - 0.05) < 0.005
    policy = make_policy("predicted_ttft", PrefixIndex(), model)
    assert policy.name == "predicted_ttft"


def test_replica_that_answers_slower_than_predicted_is_avoided_then_retried():
    cat = catalog(n=2, max_running=100)
    router = make_router(prefill_ms_per_token=0.01, decode_ms_per_running=0.0)
    prompt = "Q" * 400
    d1, t1 = route(router, cat, prompt, now=0.0)
    # the engine took 500 ms where the model said ~1 ms: a slow host
    router.first_byte(t1, now=0.5)  # 500 ms after its dispatch
    assert router.bias_ms(d1.replica.id, 0.5) > 50
    d2, _ = route(router, cat, prompt, now=0.6)
    assert d2.replica.id != d1.replica.id  # the cached prefix is not worth 100 ms of measured slowness
    assert router.bias_ms(d1.replica.id, 60.0) < 1  # the penalty fades, so it is tried again later


def test_a_replica_is_judged_from_its_dispatch_not_from_the_clients_wait_in_the_edge_queue():
    """A request that waited 10 s in the edge's queue and then got its first token as predicted after
    its dispatch was served promptly: the replica gains no bias and the fleet's prefill cost no wait."""
    cat = catalog(n=2, max_running=100)
    router = make_router(prefill_ms_per_token=0.05, decode_ms_per_running=0.0)
    per_token = router.ttft_model.prefill_ms_per_token
    decision, ticket = route(router, cat, "Q" * 4000, now=10.0)
    router.first_byte(ticket, now=10.0 + (ticket.rtt_ms + ticket.uncached_tokens * per_token) / 1000)
    assert abs(router.bias_ms(decision.replica.id, 10.1)) < 5
    assert router.ttft_model.prefill_ms_per_token == pytest.approx(per_token, rel=0.05)


def test_a_new_scorer_is_one_class_and_one_registry_line(monkeypatch):
    from dataplane.edge import scoring

    monkeypatch.setattr(scoring, "SCORERS", dict(scoring.SCORERS))  # this test's registration is its own

    class AvoidOddReplicas:
        """A made-up signal: odd-numbered replicas cost 1 s more."""

        name = "avoid_odd"

        def __init__(self, ctx):
            self.ctx = ctx

        def score(self, req, cand, est, now):
            return 1000.0 if int(cand.replica.id[-1]) % 2 else 0.0

    scoring.register("avoid_odd", AvoidOddReplicas)
    cat = catalog(n=4, max_running=100)
    plain = make_router()
    weighted = make_router(routing_profile="predicted_ttft:1,prefix:1,avoid_odd:1")
    picked = {route(weighted, cat, f"prompt {i} " * 50)[0].replica.id for i in range(12)}
    assert picked <= {"rep0", "rep2"} and picked
    assert {route(plain, cat, f"prompt {i} " * 50)[0].replica.id for i in range(12)} & {"rep1", "rep3"}
    with pytest.raises(ValueError, match="unknown scorer"):
        scoring.parse_profile("predicted_ttft,nope:2")
    with pytest.raises(ValueError, match="exists already"):
        scoring.register("prefix", AvoidOddReplicas)
