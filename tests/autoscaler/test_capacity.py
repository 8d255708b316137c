"""Spot hedging, tenant quotas and consolidation."""

from __future__ import annotations

from controlplane.autoscaler import AutoscalerState, NodeSignal, PoolObservation, decide

from .conftest import Driver, make_replica, make_spec


def _spot_pool(n_spot: int, n_od: int, *, starting_spot: int = 0, load: int = 80):
    replicas = [make_replica(i, running=load, spot=True) for i in range(n_spot)]
    replicas += [make_replica(100 + i, running=load) for i in range(n_od)]
    replicas += [make_replica(200 + i, state="starting", spot=True, started_at=0.0) for i in range(starting_spot)]
    return tuple(replicas)


def test_spot_mix_keeps_an_on_demand_base():
    spec = make_spec(spot_policy="spot_with_fallback", spot_base_on_demand=1, max_replicas=10)
    obs = PoolObservation(now=0.0, replicas=(), activation_requested=True)
    decision, _ = decide(spec, obs, AutoscalerState())
    assert [a.spot for a in decision.add] == [False]  # a single replica is the on-demand base
    # Grow from one on-demand replica: the base stays one on-demand, the rest are spot.
    obs = PoolObservation(now=0.0, replicas=(make_replica(0, running=100, queue=200),))
    decision, _ = decide(spec, obs, AutoscalerState())
    target = decision.target_replicas
    assert target >= 4
    assert [a.spot for a in decision.add] == [True] * (target - 1)
    assert decision.signals["spot_target"] == target - 1 and decision.signals["on_demand_target"] == 1


def test_spot_outage_falls_back_to_on_demand_then_returns_to_spot():
    spec = make_spec(spot_policy="spot_with_fallback", spot_base_on_demand=1, max_replicas=10)
    driver = Driver(spec)
    # 4 replicas wanted (3 spot + 1 on-demand base); two spot replicas were just preempted.
    survivors = _spot_pool(1, 1, load=90)
    outage = PoolObservation(now=0.0, replicas=survivors + tuple(
        make_replica(300 + i, running=0, spot=True, state="starting", started_at=0.0) for i in range(2)),
        spot_unavailable_until=900.0)
    state = AutoscalerState(need_samples=tuple((float(t), 4.0) for t in range(-600, 0, 5)))
    driver.state = state
    decision = driver.tick(outage)
    assert decision.target_replicas == 4
    # The spot launches that cannot be fulfilled are dropped and covered by on-demand.
    assert sorted(decision.drain) == ["r300", "r301"]
    assert [a.spot for a in decision.add] == [False, False]
    assert any("on-demand fallback" in r for r in decision.reasons)

    # Spot is back: spot replicas are launched again; the stand-ins stay until those are ready.
    fallback = _spot_pool(1, 3, load=68)
    back = driver.tick(PoolObservation(now=1000.0, replicas=fallback))
    assert [a.spot for a in back.add] == [True, True]
    assert back.drain == ()
    starting = fallback + tuple(make_replica(400 + i, state="starting", spot=True, started_at=1000.0)
                                for i in range(2))
    waiting = driver.tick(PoolObservation(now=1005.0, replicas=starting))
    assert waiting.drain == () and waiting.add == ()
    # Once the new spot replicas are ready, the extra on-demand ones are drained.
    ready = fallback + tuple(make_replica(400 + i, running=20, spot=True) for i in range(2))
    settled = driver.tick(PoolObservation(now=1200.0, replicas=ready))
    assert len(settled.drain) == 2
    assert all(rid.startswith("r10") for rid in settled.drain)  # on-demand stand-ins, not the base...
    kept_od = [r for r in ready if not r.spot and r.replica_id not in settled.drain]
    assert len(kept_od) == 1  # ...one on-demand base remains


def test_fallback_pool_uses_on_demand_when_spot_is_not_cheaper():
    spec = make_spec(spot_policy="spot_with_fallback", spot_base_on_demand=0, max_replicas=10)
    flooded = (make_replica(0, running=100, queue=200),)
    cheap, _ = decide(spec, PoolObservation(now=0.0, replicas=flooded, prices={"spot": 1.0, "on_demand": 3.0}),
                      AutoscalerState())
    parity, _ = decide(spec, PoolObservation(now=0.0, replicas=flooded, prices={"spot": 3.0, "on_demand": 3.0}),
                       AutoscalerState())
    assert cheap.add and all(a.spot for a in cheap.add)
    assert parity.add and not any(a.spot for a in parity.add)
    assert any("not cheaper" in r for r in parity.reasons)


def test_pure_spot_pool_does_not_launch_during_outage():
    spec = make_spec(spot_policy="spot", max_replicas=10)
    obs = PoolObservation(now=0.0, replicas=(make_replica(0, running=100, queue=300, spot=True),),
                          spot_unavailable_until=60.0)
    decision, _ = decide(spec, obs, AutoscalerState())
    assert decision.add == ()
    later, _ = decide(spec, PoolObservation(now=61.0, replicas=obs.replicas), AutoscalerState())
    assert later.add and all(a.spot for a in later.add)


def test_dedicated_pool_never_exceeds_tenant_gpu_quota():
    # 2 GPUs per replica, quota 10 GPUs, the tenant already uses 6 (4 of them in this pool).
    spec = make_spec(gpus_per_replica=2, tenant_gpu_quota=10, tenant_gpus_in_use=6, max_replicas=20)
    flooded = tuple(make_replica(i, running=100, queue=400, gpus=2) for i in range(2))
    decision, _ = decide(spec, PoolObservation(now=0.0, replicas=flooded), AutoscalerState())
    assert len(decision.add) == 2  # 4 free GPUs / 2 per replica
    assert decision.target_replicas == 4
    assert any("quota" in r for r in decision.reasons)
    # At the quota: nothing more, however deep the queue.
    spec_full = make_spec(gpus_per_replica=2, tenant_gpu_quota=10, tenant_gpus_in_use=10, max_replicas=20)
    decision, _ = decide(spec_full, PoolObservation(now=0.0, replicas=flooded), AutoscalerState())
    assert decision.add == ()


def test_consolidation_drains_the_emptier_node():
    nodes = (NodeSignal("big", 8, 4), NodeSignal("small", 8, 2), NodeSignal("other", 8, 8))
    replicas = (
        make_replica(0, running=60, node="big", gpus=2),
        make_replica(1, running=60, node="big", gpus=2),
        make_replica(2, running=60, node="small", gpus=2),
    )
    state = AutoscalerState(need_samples=tuple((float(t), 3.0) for t in range(-600, 0, 5)))
    decision, _ = decide(make_spec(), PoolObservation(now=0.0, replicas=replicas, nodes=nodes), state)
    assert decision.add == () and decision.drain == ()
    assert [(m.replica_id, m.from_node, m.to_node) for m in decision.consolidate] == [("r2", "small", "big")]


def test_consolidation_leaves_nodes_shared_with_other_pools():
    # "small" also hosts 2 GPUs of another pool, so moving ours would not free it; "big" is
    # all ours but its replicas do not fit anywhere else.
    nodes = (NodeSignal("big", 8, 6), NodeSignal("small", 8, 4))
    replicas = (
        *(make_replica(i, running=60, node="big", gpus=2) for i in range(3)),
        make_replica(3, running=60, node="small", gpus=2),
    )
    state = AutoscalerState(need_samples=tuple((float(t), 4.0) for t in range(-600, 0, 5)))
    decision, _ = decide(make_spec(), PoolObservation(now=0.0, replicas=replicas, nodes=nodes), state)
    assert decision.consolidate == ()


def test_new_replicas_are_placed_on_free_gpus_first():
    nodes = (NodeSignal("n0", 8, 6), NodeSignal("n1", 8, 2))
    flooded = (make_replica(0, running=100, queue=100, node="n0", gpus=2),)
    spec = make_spec(gpus_per_replica=2)
    decision, _ = decide(spec, PoolObservation(now=0.0, replicas=flooded, nodes=nodes), AutoscalerState())
    placements = [a.node_id for a in decision.add]
    assert placements[0] == "n0"  # best fit: the fuller node that still has room
    assert placements.count("n1") <= 3
