"""Fixed-step simulation of one pool driven by a trace and an autoscaling policy.

Every ``sync_s`` the edge routes the arrivals of that slice to the ready replica with the
fewest outstanding requests (requests that find no ready replica are held, as the edge's
activator does, and count as having waited on a cold start), then every replica's engine
runs up to the end of the slice. Every ``interval_s`` of the policy it gets a
``PoolObservation`` built from the engines' gauges and the edge's rate history, and its
target is applied by ``follow_target``, the simulation's stand-in for the fleet loop (one
market, no nodes to pack): additions start after a cold start drawn around the profile's
model-ready time, drains stop routing and remove the replica once it is empty.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.autoscale.engine import Replica, ReplicaProfile, StepTimes
from bench.autoscale.trace import Trace
from controlplane.autoscaler.decision import Decision
from controlplane.autoscaler.policy import replica_utilization
from controlplane.autoscaler.signals import PoolObservation, PoolSpec, ReplicaSignal

DecideFn = Callable[[PoolSpec, PoolObservation, Any], tuple[Decision, Any]]

HISTORY_STEP_S = 5.0
TTFT_WINDOW_S = 60.0


@dataclass
class PolicyRunner:
    name: str
    decide: DecideFn
    state: Any
    interval_s: float


@dataclass
class Result:
    name: str
    requests: int
    gpu_hours: float
    slo_attainment: float
    scale_events: int
    replicas_launched: int
    cold_start_waits: int
    ttft_p50_s: float
    ttft_p95_s: float
    peak_replicas: int
    timeline: list[tuple[float, int, int, float]] = field(default_factory=list)  # (t, active, ready, rps)
    decisions: list[tuple[float, Decision]] = field(default_factory=list)


def follow_target(replicas: Sequence[ReplicaSignal], target: int) -> tuple[int, list[str]]:
    """What the fleet does with a pool's target, reduced to one market and no node packing:
    (replicas to launch, replica ids to drain).

    The surplus goes starting replicas first (nothing to finish; the newest first), then the
    least loaded ready ones, and never leaves fewer ready replicas than the target."""
    active = [r for r in replicas if r.active]
    if len(active) < target:
        return target - len(active), []

    def order(r: ReplicaSignal) -> tuple:
        if r.state == "starting":
            return (0, -r.started_at, 0.0)
        return (1, 0.0, replica_utilization(r))

    ready_left = sum(1 for r in active if r.state == "ready")
    surplus = len(active) - target
    drains: list[str] = []
    for r in sorted(active, key=order):
        if surplus <= 0:
            break
        if r.state == "ready":
            if ready_left - 1 < target:
                continue
            ready_left -= 1
        drains.append(r.replica_id)
        surplus -= 1
    return 0, drains


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class PoolSimulation:
    def __init__(self, trace: Trace, profile: ReplicaProfile, spec: PoolSpec, seed: int,
                 cold_start_sigma: float = 0.25, sync_s: float = 1.0):
        self.trace = trace
        self.profile = profile
        self.spec = spec
        self.times = StepTimes(profile)
        self.rng = random.Random(seed)
        self.cold_start_sigma = cold_start_sigma
        self.sync_s = sync_s
        self.base_ready_s = profile.model_ready_seconds
        self.replicas: dict[str, Replica] = {}
        self.next_id = 0
        self.gpu_seconds = 0.0
        self.ttft: list[float | None] = [None] * len(trace)
        self.recent_ttft: deque = deque()  # (time of first token, ttft)
        self.pending: deque = deque()  # request indices held at the edge
        self.cold_waits = 0
        self.ready_samples: list[float] = []
        self.request_history: list[tuple[float, float]] = []
        self.token_history: list[tuple[float, float]] = []
        self.last_request_at: float | None = None

    # -- replicas
    def launch(self, now: float, spot: bool) -> None:
        cold = self.base_ready_s * self.rng.lognormvariate(0.0, self.cold_start_sigma)
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.replicas[rid] = Replica(rid, self.profile, self.times, now, now + cold, self.spec.gpus_per_replica, spot)

    def retire(self, replica: Replica, at: float) -> None:
        self.gpu_seconds += (at - replica.launched_at) * replica.gpus
        del self.replicas[replica.replica_id]

    def drain(self, rid: str, now: float) -> None:
        replica = self.replicas.get(rid)
        if replica is None:
            return
        if replica.state == "starting":
            self.retire(replica, now)
        else:
            replica.state = "draining"

    # -- routing
    def route(self, index: int, candidates: list[Replica]) -> None:
        target = min(candidates, key=Replica.outstanding)
        target.submit(self.trace.arrivals[index], self.trace.prompts[index], self.trace.outputs[index], index)

    def observe(self, now: float) -> PoolObservation:
        while self.recent_ttft and self.recent_ttft[0][0] < now - TTFT_WINDOW_S:
            self.recent_ttft.popleft()
        p95 = percentile([v for _, v in self.recent_ttft], 0.95) if len(self.recent_ttft) >= 20 else None
        signals = tuple(
            ReplicaSignal(
                replica_id=r.replica_id, node_id=r.replica_id, state=r.state, spot=r.spot,
                num_queue_reqs=r.queued(now), num_running_reqs=len(r.running),
                max_running_requests=r.max_running, kv_usage=r.kv_used / r.kv_capacity,
                ttft_p95_s=p95 if r.state == "ready" else None, started_at=r.launched_at,
                ready_at=r.ready_at if r.state != "starting" else None, gpus=r.gpus,
            )
            for r in self.replicas.values()
        )
        return PoolObservation(
            now=now, replicas=signals, request_rate_history=self.request_history,
            token_rate_history=self.token_history, model_ready_seconds=tuple(self.ready_samples[-50:]),
            last_request_at=self.last_request_at, activation_requested=bool(self.pending),
        )

    def run(self, runner: PolicyRunner) -> Result:
        trace, arrivals = self.trace, self.trace.arrivals
        end = trace.shape.hours * 3600
        n = len(trace)
        i = 0
        t = 0.0
        next_tick = 0.0
        next_history = HISTORY_STEP_S
        bucket_requests = bucket_tokens = 0
        events = launched = peak = 0
        timeline, decisions = [], []
        first_tokens: list = []
        while t < end:
            t_next = t + self.sync_s
            # Replicas whose cold start ends in this slice become routable from their ready time.
            becoming = []
            for r in self.replicas.values():
                if r.state == "starting" and r.ready_at < t_next:
                    r.state = "ready"
                    self.ready_samples.append(r.ready_at - r.launched_at)
                    becoming.append(r)
            ready = [r for r in self.replicas.values() if r.state == "ready"]
            settled = [r for r in ready if r not in becoming]
            if becoming and self.pending:
                while self.pending:
                    self.route(self.pending.popleft(), ready)
            while i < n and arrivals[i] < t_next:
                a = arrivals[i]
                bucket_requests += 1
                bucket_tokens += trace.prompts[i] + trace.outputs[i]
                self.last_request_at = a
                candidates = settled if not becoming else [r for r in ready if r.ready_at <= a]
                if candidates:
                    self.route(i, candidates)
                elif becoming:
                    self.cold_waits += 1
                    self.route(i, sorted(becoming, key=lambda r: r.ready_at)[:1])
                else:
                    self.cold_waits += 1
                    self.pending.append(i)
                i += 1
            for r in list(self.replicas.values()):
                if r.state == "starting":
                    continue
                r.advance(t_next, first_tokens)
                if r.state == "draining" and r.idle():
                    self.retire(r, max(t_next - self.sync_s, min(r.clock, t_next)))
            for index, value, at in first_tokens:
                self.ttft[index] = value
                self.recent_ttft.append((at, value))
            first_tokens.clear()
            t = t_next
            if t >= next_history:
                self.request_history.append((t, bucket_requests / HISTORY_STEP_S))
                self.token_history.append((t, bucket_tokens / HISTORY_STEP_S))
                bucket_requests = bucket_tokens = 0
                next_history += HISTORY_STEP_S
            if t >= next_tick:
                next_tick += runner.interval_s
                observation = self.observe(t)
                decision, runner.state = runner.decide(self.spec, observation, runner.state)
                launches, drains = follow_target(observation.replicas, decision.target_replicas)
                for _ in range(launches):
                    self.launch(t, False)
                for rid in drains:
                    self.drain(rid, t)
                if launches or drains:
                    events += 1
                    launched += launches
                    decisions.append((t, decision))
            active = sum(1 for r in self.replicas.values() if r.state != "draining")
            peak = max(peak, len(self.replicas))
            if int(t) % 60 == 0:
                rps = self.request_history[-1][1] if self.request_history else 0.0
                timeline.append((t, active, len(ready), rps))
        for r in list(self.replicas.values()):
            self.retire(r, end)
        slo = self.spec.ttft_slo_s
        done = [v for v in self.ttft if v is not None]
        within = sum(1 for v in done if v <= slo)
        return Result(
            name=runner.name, requests=n, gpu_hours=self.gpu_seconds / 3600,
            slo_attainment=within / n if n else 1.0, scale_events=events, replicas_launched=launched,
            cold_start_waits=self.cold_waits, ttft_p50_s=percentile(done, 0.5), ttft_p95_s=percentile(done, 0.95),
            peak_replicas=peak, timeline=timeline, decisions=decisions,
        )


def single_replica_p95(trace: Trace, profile: ReplicaProfile) -> tuple[float, int]:
    """p95 TTFT of one always-ready replica fed ``trace`` (unfinished requests count as
    infinitely late), and how many requests it served."""
    replica = Replica("calib", profile, StepTimes(profile), 0.0, 0.0, 1)
    replica.state = "ready"
    out: list = []
    end = trace.arrivals[-1] if trace.arrivals else 0.0
    for k, a in enumerate(trace.arrivals):
        replica.submit(a, trace.prompts[k], trace.outputs[k], k)
    replica.advance(end + 60.0, out)
    values = sorted(v for _, v, _ in out)
    values += [math.inf] * (len(trace) - len(values))
    return (values[min(len(values) - 1, int(0.95 * len(values)))] if values else 0.0), len(out)
