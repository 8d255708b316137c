"""Invariants over arbitrary pools, checked with Hypothesis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.autoscaler import AutoscalerState, PoolObservation, decide
from controlplane.autoscaler.signals import ReplicaSignal

from .conftest import make_spec

replica_states = st.sampled_from(["starting", "ready", "draining"])


@st.composite
def pools(draw):
    n = draw(st.integers(0, 12))
    replicas = []
    for i in range(n):
        state = draw(replica_states)
        ready = state != "starting"
        replicas.append(ReplicaSignal(
            replica_id=f"r{i}", node_id=f"n{i % 4}", state=state, spot=draw(st.booleans()),
            num_queue_reqs=draw(st.integers(0, 400)) if ready else 0,
            num_running_reqs=draw(st.integers(0, 100)) if ready else 0, max_running_requests=100,
            kv_usage=draw(st.floats(0, 1)) if ready else 0.0, started_at=-draw(st.floats(0, 5000)),
            ready_at=0.0 if ready else None,
        ))
    min_r = draw(st.integers(0, 4))
    spec = make_spec(
        kind=draw(st.sampled_from(["warm", "scale_to_zero"])), min_replicas=min_r,
        max_replicas=draw(st.integers(max(1, min_r), 16)), idle_timeout_s=draw(st.floats(10, 2000)),
    )
    history = draw(st.lists(st.tuples(st.floats(-600, 0), st.integers(0, 20)), max_size=30))
    state = AutoscalerState(
        need_samples=tuple(sorted((t, float(v)) for t, v in history)),
        target=draw(st.none() | st.integers(0, 16)),
        last_scale_up_at=draw(st.none() | st.floats(-3000, 0)),
        panic_until=draw(st.none() | st.floats(-100, 100)),
    )
    obs = PoolObservation(
        now=0.0, replicas=tuple(replicas), last_request_at=draw(st.none() | st.floats(-3000, 0)),
        activation_requested=draw(st.booleans()),
    )
    return spec, obs, state


@settings(max_examples=300, deadline=None)
@given(pools())
def test_target_within_bounds_except_scale_to_zero(case):
    spec, obs, state = case
    decision, new_state = decide(spec, obs, state)
    if decision.target_replicas == 0 and spec.min_replicas > 0:
        assert spec.kind == "scale_to_zero"
        assert not obs.activation_requested
    else:
        floor = spec.min_replicas if spec.kind == "warm" or decision.target_replicas else 0
        assert floor <= decision.target_replicas <= spec.max_replicas
    assert new_state.target == decision.target_replicas
    # The state survives the executor's JSON round trip unchanged.
    assert AutoscalerState.from_json(new_state.to_json()) == new_state


@settings(max_examples=300, deadline=None)
@given(pools())
def test_never_shrinks_below_the_panic_need(case):
    """A scale-down stops at what the panic window needs (the target holds instead), unless the
    pool goes to zero or its max_replicas is lower still."""
    spec, obs, state = case
    decision, _ = decide(spec, obs, state)
    current = state.target if state.target is not None else sum(1 for r in obs.replicas if r.active)
    target = decision.target_replicas
    if 0 < target < current:
        assert target >= min(decision.signals["panic_need"], spec.max_replicas)
        assert not decision.signals["panic"] or target == spec.max_replicas


@settings(max_examples=300, deadline=None)
@given(pools())
def test_the_policy_answers_a_count_and_the_signals_behind_it(case):
    spec, obs, state = case
    decision, _ = decide(spec, obs, state)
    assert set(decision.to_dict()) == {"target_replicas", "reasons", "signals"}
    assert decision.reasons and all(isinstance(r, str) for r in decision.reasons)
    assert {"panic_need", "stable_need", "need_units", "queue_total"} <= set(decision.signals)
