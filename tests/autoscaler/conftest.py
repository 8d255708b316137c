"""Builders for autoscaler inputs, so each test states only what it is about."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.autoscaler import (
    AutoscalerConfig,
    AutoscalerState,
    Decision,
    PoolObservation,
    PoolSpec,
    ReplicaSignal,
    decide,
)


def make_replica(i: int, *, state: str = "ready", running: int = 0, queue: int = 0, kv: float = 0.0,
                 max_running: int = 100, spot: bool = False, node: str | None = None, gpus: int = 1,
                 ttft: float | None = None, started_at: float = -1000.0) -> ReplicaSignal:
    return ReplicaSignal(
        replica_id=f"r{i}", node_id=node or f"n{i}", state=state, spot=spot, num_queue_reqs=queue,
        num_running_reqs=running, max_running_requests=max_running, kv_usage=kv, ttft_p95_s=ttft,
        started_at=started_at, ready_at=None if state == "starting" else started_at + 100, gpus=gpus,
    )


def pool_at(n: int, utilization: float, **kwargs) -> tuple[ReplicaSignal, ...]:
    """n ready replicas each running ``utilization`` of its 100 batch slots."""
    return tuple(make_replica(i, running=round(100 * utilization), **kwargs) for i in range(n))


def make_spec(**changes) -> PoolSpec:
    base = PoolSpec(pool_id="p", kind="warm", min_replicas=1, max_replicas=20, ttft_slo_s=2.0,
                    idle_timeout_s=600.0)
    return replace(base, **changes)


class Driver:
    """Feeds a sequence of observations through ``decide`` the way the executor does: state goes
    round trip through JSON."""

    def __init__(self, spec: PoolSpec, config: AutoscalerConfig | None = None):
        self.spec = spec
        self.config = config or AutoscalerConfig()
        self.state = AutoscalerState()
        self.decisions: list[tuple[float, Decision, int]] = []  # (t, decision, active replicas seen)

    def tick(self, obs: PoolObservation) -> Decision:
        decision, state = decide(self.spec, obs, self.state, self.config)
        self.state = AutoscalerState.from_json(state.to_json())
        self.decisions.append((obs.now, decision, sum(1 for r in obs.replicas if r.active)))
        return decision

    def changes(self) -> list[tuple[float, Decision]]:
        """Decisions that asked the fleet for a different number of replicas than it had."""
        return [(t, d) for t, d, active in self.decisions if d.target_replicas != active]


@pytest.fixture
def spec() -> PoolSpec:
    return make_spec()


class MiniPool:
    """A pool whose total load (in busy batch slots of 100-slot replicas) is given per tick
    and spread evenly over the ready replicas. It follows each decision's target the way the
    fleet does, reduced to its count: missing replicas start and become ready after
    ``ready_s``; surplus ones leave at once, starting ones first. Enough to watch the
    policy's dynamics without an engine."""

    def __init__(self, driver: Driver, replicas: int, ready_s: float = 60.0, step_s: float = 5.0):
        self.driver = driver
        self.ready_s = ready_s
        self.step_s = step_s
        self.now = 0.0
        self.next_id = 0
        self.replicas: dict[str, tuple[str, float]] = {}  # id -> (state, ready time)
        self.launched = self.stopped = 0  # by the last step
        for _ in range(replicas):
            self._add(ready_at=-1.0)

    def _add(self, ready_at: float) -> None:
        self.replicas[f"m{self.next_id}"] = ("starting", ready_at)
        self.next_id += 1

    def ready_count(self) -> int:
        return sum(1 for s, _ in self.replicas.values() if s == "ready")

    def active_count(self) -> int:
        return len(self.replicas)

    def observe(self, load_slots: float, **obs_fields) -> PoolObservation:
        for rid, (_, at) in list(self.replicas.items()):
            if at <= self.now:
                self.replicas[rid] = ("ready", at)
        ready = [rid for rid, (s, _) in self.replicas.items() if s == "ready"]
        per = load_slots / len(ready) if ready else 0.0
        signals = []
        for rid, (s, at) in self.replicas.items():
            running = min(100, round(per)) if s == "ready" else 0
            queue = max(0, round(per) - 100) if s == "ready" else 0
            signals.append(ReplicaSignal(rid, f"node-{rid}", s, False, queue, running, 100, min(1.0, per / 100),
                                         None, at - self.ready_s, at if s == "ready" else None, 1))
        return PoolObservation(now=self.now, replicas=tuple(signals),
                               model_ready_seconds=(self.ready_s,) * 5, **obs_fields)

    def step(self, load_slots: float, **obs_fields) -> Decision:
        decision = self.driver.tick(self.observe(load_slots, **obs_fields))
        missing = decision.target_replicas - len(self.replicas)
        self.launched, self.stopped = max(0, missing), max(0, -missing)
        for _ in range(self.launched):
            self._add(ready_at=self.now + self.ready_s)
        # Newest first: starting replicas (added last) go before ready ones.
        for rid in list(self.replicas)[::-1][: self.stopped]:
            del self.replicas[rid]
        self.now += self.step_s
        return decision
