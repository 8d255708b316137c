"""VTC fair queue: ordering, lifting, priorities, bounds, and the service-gap property."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.edge.fairness import FairQueue, Waiter


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
