"""Tenant GPU quotas bound the target. (The spot / on-demand split is the fleet's:
tests/fleet/test_markets.py; placement and consolidation are tested with the fleet.)"""

from __future__ import annotations

from controlplane.autoscaler import AutoscalerState, PoolObservation, decide

from .conftest import make_replica, make_spec


def test_dedicated_pool_never_exceeds_tenant_gpu_quota():
    # 2 GPUs per replica, quota 10 GPUs, the tenant already uses 6 (4 of them in this pool).
    spec = make_spec(gpus_per_replica=2, tenant_gpu_quota=10, tenant_gpus_in_use=6, max_replicas=20)
    flooded = tuple(make_replica(i, running=100, queue=400, gpus=2) for i in range(2))
    decision, _ = decide(spec, PoolObservation(now=0.0, replicas=flooded), AutoscalerState())
    assert decision.target_replicas == 4  # 2 more: 4 free GPUs / 2 per replica
    assert any("quota" in r for r in decision.reasons)
    # At the quota: nothing more, however deep the queue.
    spec_full = make_spec(gpus_per_replica=2, tenant_gpu_quota=10, tenant_gpus_in_use=10, max_replicas=20)
    decision, _ = decide(spec_full, PoolObservation(now=0.0, replicas=flooded), AutoscalerState())
    assert decision.target_replicas == 2


def test_lowered_quota_sheds_the_excess():
    # The tenant holds 12 GPUs (this pool's 4 replicas × 2 and 4 elsewhere) against a quota of 8.
    spec = make_spec(gpus_per_replica=2, tenant_gpu_quota=8, tenant_gpus_in_use=12, max_replicas=20)
    busy = tuple(make_replica(i, running=90, gpus=2) for i in range(4))
    decision, _ = decide(spec, PoolObservation(now=0.0, replicas=busy), AutoscalerState())
    assert decision.target_replicas == 2  # 4 GPUs over: two replicas go
    assert any("quota" in r for r in decision.reasons)
