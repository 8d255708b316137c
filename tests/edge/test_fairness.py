"""VTC fair queue (ordering, lifting, priorities, bounds, the service-gap property) and the share
guard that keeps slots free for tenants under their fair share."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.edge.fairness import FairQueue, RollingPeak, ShareGuard, Waiter


def w(tenant, priority="interactive", tokens=100, weight=1.0):
    return Waiter(tenant, weight, priority, tokens, 0.0)


def drain(q):
    order = []
    while (nxt := q.pop_next()) is not None:
        q.charge_admit(nxt.tenant_id, nxt.weight, nxt.prompt_tokens)
        order.append(nxt.tenant_id)
    return order


def test_least_served_backlogged_tenant_goes_first():
    q = FairQueue()
    for _ in range(5):
        q.push(w("flood"))
    q.push(w("light"))  # arrives last, behind five flood requests
    # the light tenant waits for at most one flood request, not for the whole flood
    assert drain(q)[:2] == ["flood", "light"]
    # while both are backlogged, the one with less service so far goes next
    q.push(w("flood"))
    q.push(w("light"))
    q.charge_admit("flood", 1.0, 10_000)  # e.g. its earlier requests finished with long outputs
    assert drain(q) == ["light", "flood"]


def test_idle_tenant_is_lifted_to_the_backlogged_minimum():
    q = FairQueue()
    q.charge_admit("a", 1.0, 5000)
    q.push(w("a"))
    q.push(w("newcomer"))  # counter 0, lifted to a's 5000
    assert q.counters["newcomer"] == 5000
    # ties fall back to arrival order
    assert q.pop_next().tenant_id == "a"


def test_interactive_always_before_batch():
    q = FairQueue()
    q.push(w("t1", "batch"))
    q.charge_admit("t2", 1.0, 1_000_000)
    q.push(w("t2", "interactive"))
    assert q.pop_next().priority == "interactive"


def test_weights_scale_service():
    q = FairQueue()
    q.push(w("bronze"))
    q.push(w("gold"))
    q.charge_admit("gold", 4.0, 400)  # 100 weighted tokens
    q.charge_admit("bronze", 1.0, 200)  # 200
    assert q.pop_next().tenant_id == "gold"


def test_bounded_and_removable():
    q = FairQueue(max_size=2)
    a, b = w("a"), w("b")
    assert q.push(a) and q.push(b) and not q.push(w("c"))
    assert q.remove(a) and not q.remove(a)
    assert len(q) == 1 and q.pop_next() is b


def test_within_a_tenant_those_that_can_still_meet_the_slo_go_first():
    q = FairQueue()
    old = [Waiter("t", 1.0, "interactive", 100, 0.0, deadline=1.0) for _ in range(3)]
    fresh = Waiter("t", 1.0, "interactive", 100, 5.0, deadline=6.0)
    for waiter in [*old, fresh]:
        q.push(waiter)
    # at t = 0.5 nobody is late yet: arrival order
    assert next(q.heads(0.5)) is old[0]
    # at t = 5.5 the first three are past their deadline: the one that can still make it goes
    # first, then the late ones in arrival order (nothing is dropped)
    order = [q.pop_next(5.5) for _ in range(4)]
    assert order == [fresh, *old]
    assert q.pop_next(5.5) is None


def test_late_waiters_keep_arrival_order_when_deadlines_do_not():
    q = FairQueue()
    first = Waiter("t", 1.0, "interactive", 100, 0.0, deadline=3.0)
    second = Waiter("t", 1.0, "interactive", 9000, 0.1, deadline=1.0)  # a long prompt: less time left
    q.push(first)
    q.push(second)
    assert next(q.heads(2.0)) is first  # second is late, first still fresh
    assert [q.pop_next(4.0), q.pop_next(4.0)] == [first, second]


def test_deadlines_reorder_within_a_tenant_never_across_tenants():
    q = FairQueue()
    q.charge_admit("served", 1.0, 1000)
    late = Waiter("light", 1.0, "interactive", 100, 0.0, deadline=1.0)
    q.push(late)
    q.push(Waiter("served", 1.0, "interactive", 100, 4.0, deadline=9.0))
    # the least-served tenant still goes first, with its late request (VTC decides the tenant)
    assert q.pop_next(5.0) is late
    # without deadlines (batch work, pools without an SLO) a tenant's queue stays in arrival order
    q2 = FairQueue()
    batch = [w("b", "batch") for _ in range(3)]
    for waiter in batch:
        q2.push(waiter)
    assert [q2.pop_next(1e9) for _ in range(3)] == batch


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(1, 400)), min_size=20, max_size=200))
def test_service_gap_between_backlogged_tenants_is_bounded(arrivals):
    """Every tenant stays backlogged (each has many queued requests); serving in VTC order keeps the
    weighted service of any two within the largest single request's cost of each other."""
    q = FairQueue(max_size=10_000)
    for tenant, tokens in arrivals:
        q.push(w(tenant, tokens=tokens))
    tenants = {t for t, _ in arrivals}
    served = dict.fromkeys(tenants, 0)
    max_cost = max(tok for _, tok in arrivals)
    while True:
        backlogged = q.backlogged()
        if backlogged != tenants:
            break  # the bound holds while all of them are backlogged
        nxt = q.pop_next()
        q.charge_admit(nxt.tenant_id, 1.0, nxt.prompt_tokens)
        served[nxt.tenant_id] += nxt.prompt_tokens
        vals = [served[t] for t in tenants]
        assert max(vals) - min(vals) <= 2 * max_cost


def test_share_guard_only_binds_a_heavy_tenant_over_its_share():
    g = ShareGuard(burst_slots=1, active_window_s=10)
    now = 0.0
    for t in ("a", "b", "c", "d"):
        g.seen(t, now)
    # evenly loaded tenants never hold each other back, even over their share
    for t in ("a", "b", "c"):
        g.acquired(t, now)
    for _ in range(3):
        g.acquired("d", now)
    assert g.allows("a", free_slots=1, total_slots=8, now=now)
    # "flood" dispatches at many times the others' rate and holds its share: it must leave room
    g.seen("flood", now)
    for i in range(40):
        now = i * 0.05
        g.seen("flood", now)
    for _ in range(3):
        g.acquired("flood", now)
    assert not g.allows("flood", free_slots=1, total_slots=8, now=now)
    assert g.allows("a", free_slots=1, total_slots=8, now=now)  # the quiet ones still get in
    assert g.allows("flood", free_slots=8, total_slots=16, now=now)  # plenty free: work-conserving


def test_share_guard_lets_a_lone_tenant_use_everything():
    g = ShareGuard()
    g.seen("solo", 0)
    for _ in range(7):
        g.acquired("solo", 0)
    assert g.allows("solo", free_slots=1, total_slots=8, now=0)


def test_rolling_peak_remembers_the_window_before():
    p = RollingPeak(window_s=10, started=0)
    p.observe(7, 1)
    p.observe(2, 9)
    assert p.peak() == 7 and p.observed_for(9) == 9
    p.observe(3, 10.5)  # a new window begins; the 7 from the last one still counts
    assert p.peak() == 7 and p.observed_for(10.5) == float("inf")
    p.observe(1, 21)  # and is gone one window later
    assert p.peak() == 3
    p.observe(4, 60)  # after a long silence nothing old survives
    assert p.peak() == 4


def flood_many_light_tenants(g, light=30):
    """30 light tenants that each once held 2 slots, but never more than 6 between them; one tenant
    arriving at many times their rate."""
    now = 0.0
    for i in range(light):
        g.seen(f"light{i}", now)
        g.acquired(f"light{i}", now)
        g.acquired(f"light{i}", now)
        g.released(f"light{i}", now)
        g.released(f"light{i}", now)
    for i in range(6):
        g.acquired(f"light{i}", now)
    for i in range(40):
        g.seen("heavy", i * 0.05)
    for _ in range(10):
        g.acquired("heavy", 2.0)
    return 2.0


def test_share_guard_reserves_the_light_tenants_combined_peak_not_the_sum_of_theirs():
    # wait_share=0: the reserve by what the others hold alone, without the queueing cap
    g = ShareGuard(burst_slots=2, active_window_s=10, rate_window_s=2, wait_share=0)
    now = flood_many_light_tenants(g)
    total = 128
    # The sum of the light tenants' own peaks (2 + burst each, capped at the fair share) would
    # reserve ~100 slots. Just recognised as heavy, the reserve is bounded by everyone's combined
    # peak instead: 16 held at most, + 2 x sqrt(16), - the 6 the light tenants hold now = 18.
    assert not g.allows("heavy", 18, total, now)
    assert g.allows("heavy", 19, total, now)
    # Watched for a rate window: the light tenants never held more than 6 at once, so
    # 6 + 2 x sqrt(6) - 6 ~ 4.9 slots stay reserved for them...
    now += 2.5
    assert not g.allows("heavy", 4, total, now)
    assert g.allows("heavy", 5, total, now)
    # ...and the reserve follows a new combined peak of the light tenants at once: once they have
    # held 26 together, 26 + 2 x sqrt(26) stay reserved for them after they let go again.
    for i in range(6, 26):
        g.acquired(f"light{i}", now)
    for i in range(6, 26):
        g.released(f"light{i}", now)
    assert g.total_inflight == 16
    assert not g.allows("heavy", 30, total, now)
    assert g.allows("heavy", 31, total, now)


def blocked_share(rho: float, reserve: float) -> float:
    """The birth-death chain of free slots under a heavy tenant: the share of the others' arrivals
    that find none free when ``reserve`` are kept for them."""
    return (rho - 1) / (rho ** (reserve + 1) - 1)


@given(mu=st.floats(2.0, 500.0), lam=st.floats(0.5, 100.0), share=st.sampled_from([0.001, 0.01, 0.05]))
@settings(max_examples=200, deadline=None)
def test_queueing_reserve_is_the_fewest_slots_that_keep_the_wait_share(mu, lam, share):
    g = ShareGuard(rate_window_s=2, wait_share=share)
    g._release_rate = (mu, 0.0)
    r = g.queueing_reserve(lam, 0.0)
    rho = mu / lam
    if rho <= 1.0 + 1e-9:
        assert r == float("inf")  # releases no faster than the others arrive: no cap
        return
    assert blocked_share(rho, r) <= share * (1 + 1e-9)
    if r > 0:
        assert blocked_share(rho, r - 1) > share * (1 - 1e-9)


def simulate_flood(wait_share: float, slots: int = 64, quiet: int = 8, quiet_rate: float = 2.0,
                   hold_s: float = 1.0, horizon_s: float = 300.0, seed: int = 3) -> tuple[float, float]:
    """A heavy tenant with an endless backlog beside ``quiet`` tenants arriving at ``quiet_rate``/s
    each; every request holds its slot an exponential ``hold_s``. A quiet request that finds no free
    slot takes the next one that frees (VTC serves it before the heavy tenant). Returns the share
    of quiet arrivals that found no free slot, and the time-averaged free slots."""
    import heapq
    import random
    from collections import deque

    rng = random.Random(seed)
    g = ShareGuard(burst_slots=2, active_window_s=10, rate_window_s=2, wait_share=wait_share)
    events: list[tuple[float, int, str, str]] = []
    seq = 0

    def push(t: float, kind: str, tenant: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, tenant))

    for i in range(quiet):
        push(rng.expovariate(quiet_rate), "arrive", f"q{i}")
    push(0.0, "arrive", "heavy")
    free, waiting = slots, deque()
    arrivals = found_none = 0
    free_area, last = 0.0, 0.0

    def start(tenant: str, now: float) -> None:
        nonlocal free
        free -= 1
        g.acquired(tenant, now)
        push(now + rng.expovariate(1.0 / hold_s), "release", tenant)

    while events:
        now, _, kind, tenant = heapq.heappop(events)
        if now > horizon_s:
            break
        free_area += free * (now - last)
        last = now
        if kind == "arrive":
            g.seen(tenant, now)
            if tenant == "heavy":  # ten times the others' combined rate
                push(now + rng.expovariate(10 * quiet * quiet_rate), "arrive", "heavy")
            else:
                push(now + rng.expovariate(quiet_rate), "arrive", tenant)
                arrivals += 1
                if free > 0:
                    start(tenant, now)
                else:
                    found_none += 1
                    waiting.append(tenant)
        else:
            free += 1
            g.released(tenant, now)
            if waiting:
                start(waiting.popleft(), now)
        while free > 0 and g.allows("heavy", free, slots, now):
            start("heavy", now)
    return found_none / arrivals, free_area / last


def test_a_heavy_tenant_is_held_back_only_as_far_as_the_others_arrivals_need():
    """64 slots held ~1 s each free up ~64 times a second; 8 quiet tenants arrive 16 times a second.
    Reserving what they hold at their peak keeps a third of the fleet idle (~20 slots); the
    queueing cap, at the default share, keeps ~5, and still at most ~0.1 % of the quiet arrivals
    (statistically: 0.3 %) find none free. A ten times looser share saves two slots more."""
    blocked_peak, idle_peak = simulate_flood(wait_share=0)  # the reserve by what the others hold alone
    blocked_cap, idle_cap = simulate_flood(wait_share=ShareGuard().wait_share)
    blocked_loose, idle_loose = simulate_flood(wait_share=0.01)
    assert blocked_peak < 0.005
    assert blocked_cap <= 0.003 and blocked_loose <= 0.02
    assert idle_loose < idle_cap < 7 < 10 < idle_peak
