"""Fixed-step simulation of one pool driven by a trace and an autoscaling policy.

The edge, as ``dataplane/edge`` does it: every ``sync_s`` it routes the arrivals of that slice
to the ready replica with the fewest in-flight requests among those below their cap (the
replica's batch slots, ``router.capacity``); a request that finds every ready replica at its
cap, or arrives while others already wait, joins the edge's queue (one tenant: FIFO), and a
replica pulls from that queue the moment one of its requests finishes. A request that finds
no ready replica at all is held the same way (activation) and counts as having waited on a
cold start. Client-side TTFT runs from arrival at the edge, so it includes that queueing; the
SLO is judged on it. The engines' own TTFT (what their ``/metrics`` report) runs from dispatch.

Every ``interval_s`` of the policy it gets a ``PoolObservation`` built from the engines'
gauges and the edge's rate history, plus, for a policy that reads them, the edge's signals
(``EdgeSignals``: queue depth, activation hold, in-flight, queue wait and client TTFT over a
30 s window), published every 5 s as the real edge does, so a tick sees a snapshot up to 5 s
old. SkyServe's rule reads the request rate only, as in reality. The target is applied by
``follow_target``, the simulation's stand-in for the fleet loop (one market, no nodes to
pack): additions start after a cold start drawn around the profile's model-ready time, drains
stop routing and remove the replica once it is empty.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.autoscale.engine import EdgeQueue, Replica, ReplicaProfile, StepTimes
from bench.autoscale.trace import Trace
from controlplane.autoscaler.decision import Decision
from controlplane.autoscaler.policy import replica_utilization
from controlplane.autoscaler.signals import EdgeSignals, PoolObservation, PoolSpec, ReplicaSignal
from dataplane.edge.signals import SignalRecorder, histogram_quantile
from dataplane.sim.metrics import TTFT_BUCKETS

DecideFn = Callable[[PoolSpec, PoolObservation, Any], tuple[Decision, Any]]

HISTORY_STEP_S = 5.0
TTFT_WINDOW_S = 60.0  # the engines' TTFT p95 (the executor's Prometheus range)
EDGE_WINDOW_S = 30.0  # dataplane.edge.settings.signals_window_s
EDGE_INTERVAL_S = 5.0  # dataplane.edge.settings.signals_interval_s
EDGE_PUBLISH_OFFSET_S = 2.0  # edges and beat are not in step: ticks see a snapshot 3 s old
FLAP_WINDOW_S = 600.0
MODEL = "bench"  # the served model name the edge files its signals under


@dataclass
class PolicyRunner:
    name: str
    decide: DecideFn
    state: Any
    interval_s: float
    edge_signals: bool = False  # give the policy ``PoolObservation.edge``


@dataclass
class RampWindow:
    """One predictable rise of the need: at ``at`` the clairvoyant need reaches ``need``."""

    at: float
    need: int
    start: float
    end: float


@dataclass
class RampOutcome:
    at: float
    need: int
    warm: bool  # no request in the window missed the SLO while the pool was short
    misses_short: int  # requests that missed the SLO while the pool had fewer ready replicas than needed
    lead_s: float | None  # when the pool first had ``need`` ready, before (+) or after (-) ``at``
    ready_at_start: bool = False  # it had them from the window's start (lead at least at - start)


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
    flaps: int = 0  # scale-downs followed within FLAP_WINDOW_S by a scale-up
    scale_ups: int = 0
    scale_downs: int = 0
    edge_queued: int = 0  # requests that waited in the edge's queue (no free slot, or activation)
    edge_wait_p99_s: float = 0.0  # among those
    edge_queue_peak: int = 0
    engine_ttft_p95_s: float = 0.0  # from dispatch, as the engines report it
    ramps: list[RampOutcome] = field(default_factory=list)
    timeline: list[tuple[float, int, int, float]] = field(default_factory=list)  # (t, active, ready, rps)
    decisions: list[tuple[float, Decision]] = field(default_factory=list)

    @property
    def ramps_warm(self) -> int:
        return sum(1 for r in self.ramps if r.warm)


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


def count_flaps(events: Sequence[tuple[float, int, int]], window_s: float = FLAP_WINDOW_S) -> int:
    """Scale-downs followed within ``window_s`` by a scale-up. ``events``: (t, launched, drained)."""
    ups = [t for t, launched, _ in events if launched]
    flaps = 0
    for t, _, drained in events:
        if drained and any(t < u <= t + window_s for u in ups):
            flaps += 1
    return flaps


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class EngineTtft:
    """The engines' TTFT histogram (SGLang's buckets) over a trailing window of 5 s slots; its
    p95 is read as the executor reads a heartbeat's histogram: the upper bound of the bucket
    that holds it (``controlplane.fleet.autoscaling.histogram_quantile``)."""

    def __init__(self, window_s: float = TTFT_WINDOW_S, slot_s: float = HISTORY_STEP_S):
        self.ring: deque = deque([[0] * (len(TTFT_BUCKETS) + 1)], maxlen=max(1, math.ceil(window_s / slot_s)))

    def add(self, seconds: float) -> None:
        self.ring[-1][bisect_left(TTFT_BUCKETS, seconds)] += 1

    def rotate(self) -> None:
        self.ring.append([0] * (len(TTFT_BUCKETS) + 1))

    def p95(self, min_samples: int = 20) -> float | None:
        counts = [sum(slot[i] for slot in self.ring) for i in range(len(TTFT_BUCKETS) + 1)]
        total = sum(counts)
        if total < min_samples:
            return None
        cumulative = 0
        for bound, count in zip((*TTFT_BUCKETS, math.inf), counts, strict=True):
            cumulative += count
            if cumulative >= 0.95 * total:
                return None if bound == math.inf else float(bound)
        return None


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
        self.ttft: list[float | None] = [None] * len(trace)  # client-side, from arrival at the edge
        self.edge = EdgeQueue(len(trace))
        self.engine_ttft = EngineTtft()
        self.recorder = SignalRecorder(EDGE_WINDOW_S, EDGE_INTERVAL_S)  # the edge's own
        self.edge_snapshot: EdgeSignals | None = None
        self.queued_at_edge: list[int] = []  # request indices that waited in the edge's queue
        self.cold_waits = 0
        self.ready_samples: list[float] = []
        self.request_history: list[tuple[float, float]] = []
        self.token_history: list[tuple[float, float]] = []
        self.ready_series: list[int] = []  # ready replicas per sync slice
        # What each request adds to the token rate the policy reads (the engines' prompt and
        # generation token counters); a cost model may weigh them differently.
        self.token_cost: Sequence[float] = [p + o for p, o in zip(trace.prompts, trace.outputs, strict=True)]
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

    # -- the edge
    def route(self, index: int, replica: Replica, at: float) -> None:
        trace = self.trace
        replica.submit(trace.arrivals[index], trace.prompts[index], trace.outputs[index], index)
        self.edge.dispatched[index] = at

    def enqueue(self, index: int) -> None:
        trace = self.trace
        self.edge.queue.append((trace.arrivals[index], trace.prompts[index], trace.outputs[index], index))
        self.queued_at_edge.append(index)

    def publish_edge(self, now: float, ready: int) -> None:
        """What the edge publishes every EDGE_INTERVAL_S (``dataplane.edge.signals``): gauges now,
        histograms over the window, then a new slot."""
        waiting = sum(1 for item in self.edge.queue if item[0] <= now)
        window = self.recorder.window().get(MODEL)
        bounds = self.recorder.bounds
        ttft = window.ttft if window is not None else []
        waits = window.queue_wait if window is not None else []
        self.edge_snapshot = EdgeSignals(
            edges=1,
            queue_depth=waiting if ready else 0,
            activation_waiting=0 if ready else waiting,
            inflight=sum(r.outstanding() for r in self.replicas.values() if r.state != "starting"),
            queue_wait_p50_s=histogram_quantile(bounds, waits, 0.5) if waits else None,
            queue_wait_p90_s=histogram_quantile(bounds, waits, 0.9) if waits else None,
            ttft_p90_s=histogram_quantile(bounds, ttft, 0.9) if ttft else None,
            ttft_samples=sum(ttft),
            window_s=self.recorder.window_s,
        )
        self.recorder.rotate()

    def observe(self, now: float, with_edge: bool) -> PoolObservation:
        p95 = self.engine_ttft.p95()
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
        held = any(item[0] <= now for item in self.edge.queue) and not any(
            r.state == "ready" for r in self.replicas.values())
        return PoolObservation(
            now=now, replicas=signals, request_rate_history=self.request_history,
            token_rate_history=self.token_history, model_ready_seconds=tuple(self.ready_samples[-50:]),
            last_request_at=self.last_request_at, activation_requested=held,
            edge=self.edge_snapshot if with_edge else None,
        )

    def run(self, runner: PolicyRunner, ramps: Sequence[RampWindow] = (),
            need_series: Sequence[int] | None = None) -> Result:
        """Simulate the whole trace under ``runner``. ``ramps`` and ``need_series`` (the
        clairvoyant need per second) score the predictable ramps (``score_ramps``)."""
        trace, arrivals = self.trace, self.trace.arrivals
        edge, queue, dispatched = self.edge, self.edge.queue, self.edge.dispatched
        token_cost = self.token_cost
        end = trace.shape.horizon_s
        n = len(trace)
        i = 0
        t = 0.0
        next_tick = 0.0
        next_history = HISTORY_STEP_S
        next_publish = EDGE_PUBLISH_OFFSET_S
        bucket_requests = bucket_tokens = 0
        launched = peak = queue_peak = 0
        events: list[tuple[float, int, int]] = []
        timeline, decisions = [], []
        first_tokens: list = []
        while t < end:
            t_next = t + self.sync_s
            # Replicas whose cold start ends in this slice become routable from their ready time.
            for r in self.replicas.values():
                if r.state == "starting" and r.ready_at < t_next:
                    r.state = "ready"
                    self.ready_samples.append(r.ready_at - r.launched_at)
            ready = [r for r in self.replicas.values() if r.state == "ready"]
            first_up = min((r.ready_at for r in ready), default=math.inf)
            while i < n and arrivals[i] < t_next:
                a = arrivals[i]
                bucket_requests += 1
                bucket_tokens += token_cost[i]
                self.last_request_at = a
                if a < first_up:
                    self.cold_waits += 1  # no ready replica at all: held for one that is starting
                target = None
                if not queue:  # FIFO: while others wait at the edge, a newcomer queues behind them
                    best = (True, math.inf)
                    for r in ready:
                        load = len(r.waiting) + len(r.running)
                        key = (r.ready_at > a, load)  # replicas already up first, then the least loaded
                        if load < r.cap and key < best:
                            target, best = r, key
                if target is not None:
                    self.route(i, target, max(a, target.ready_at))
                else:
                    self.enqueue(i)
                i += 1
            for r in list(self.replicas.values()):
                if r.state == "starting":
                    continue
                r.advance(t_next, first_tokens, edge if r.state == "ready" else None)
                if r.state == "draining" and r.idle():
                    self.retire(r, max(t_next - self.sync_s, min(r.clock, t_next)))
            recorder = self.recorder
            for index, value, at in first_tokens:
                self.ttft[index] = value
                recorder.ttft(MODEL, value)
                self.engine_ttft.add(at - dispatched[index])
            first_tokens.clear()
            for wait in edge.waits:
                recorder.queue_wait(MODEL, wait)
            edge.waits.clear()
            queue_peak = max(queue_peak, len(queue))
            t = t_next
            ready_now = active = 0
            for r in self.replicas.values():
                if r.state == "ready":
                    ready_now += 1
                if r.state != "draining":
                    active += 1
            self.ready_series.append(ready_now)
            if t >= next_history:
                self.engine_ttft.rotate()
                self.request_history.append((t, bucket_requests / HISTORY_STEP_S))
                self.token_history.append((t, bucket_tokens / HISTORY_STEP_S))
                bucket_requests = bucket_tokens = 0
                next_history += HISTORY_STEP_S
            if t >= next_publish:
                next_publish += EDGE_INTERVAL_S
                self.publish_edge(t, ready_now)
            if t >= next_tick:
                next_tick += runner.interval_s
                observation = self.observe(t, runner.edge_signals)
                decision, runner.state = runner.decide(self.spec, observation, runner.state)
                launches, drains = follow_target(observation.replicas, decision.target_replicas)
                for _ in range(launches):
                    self.launch(t, False)
                for rid in drains:
                    self.drain(rid, t)
                if launches or drains:
                    events.append((t, launches, len(drains)))
                    launched += launches
                    decisions.append((t, decision))
            peak = max(peak, len(self.replicas))
            if int(t) % 60 == 0:
                rps = self.request_history[-1][1] if self.request_history else 0.0
                timeline.append((t, active, ready_now, rps))
        for r in list(self.replicas.values()):
            self.retire(r, end)
        slo = self.spec.ttft_slo_s
        done = [v for v in self.ttft if v is not None]
        within = sum(1 for v in done if v <= slo)
        engine = [a + v - dispatched[k] for k, (a, v) in enumerate(zip(arrivals, self.ttft, strict=True))
                  if v is not None]
        waits = [dispatched[k] - arrivals[k] for k in self.queued_at_edge if dispatched[k] is not None]
        return Result(
            name=runner.name, requests=n, gpu_hours=self.gpu_seconds / 3600,
            slo_attainment=within / n if n else 1.0, scale_events=len(events), replicas_launched=launched,
            cold_start_waits=self.cold_waits, ttft_p50_s=percentile(done, 0.5), ttft_p95_s=percentile(done, 0.95),
            peak_replicas=peak, flaps=count_flaps(events), scale_ups=sum(1 for e in events if e[1]),
            scale_downs=sum(1 for e in events if e[2]), edge_queued=len(self.queued_at_edge),
            edge_wait_p99_s=percentile(waits, 0.99), edge_queue_peak=queue_peak,
            engine_ttft_p95_s=percentile(engine, 0.95),
            ramps=score_ramps(self, ramps, need_series) if ramps and need_series is not None else [],
            timeline=timeline, decisions=decisions,
        )


def score_ramps(sim: PoolSimulation, ramps: Sequence[RampWindow], need_series: Sequence[int]) -> list[RampOutcome]:
    """For each predictable ramp: did any request in its window wait on capacity that was not
    ready? A request counts when it missed the SLO (client-side TTFT, or never served) while the
    pool had fewer ready replicas than the clairvoyant need at its arrival (``need_series``,
    per second). A miss with the needed replicas ready is load noise, not a cold start."""
    arrivals, ttft, slo = sim.trace.arrivals, sim.ttft, sim.spec.ttft_slo_s
    ready = sim.ready_series
    out = []
    for ramp in ramps:
        lo, hi = bisect_left(arrivals, ramp.start), bisect_left(arrivals, ramp.end)
        misses = 0
        for k in range(lo, hi):
            v = ttft[k]
            if v is not None and v <= slo:
                continue
            second = min(len(ready) - 1, int(arrivals[k] / sim.sync_s))
            if ready[second] < need_series[min(len(need_series) - 1, int(arrivals[k]))]:
                misses += 1
        lead, first = None, int(ramp.start / sim.sync_s)
        for second in range(first, min(len(ready), int(ramp.end / sim.sync_s))):
            if ready[second] >= ramp.need:
                lead = ramp.at - (second + 1) * sim.sync_s
                break
        out.append(RampOutcome(ramp.at, ramp.need, misses == 0, misses, lead,
                               lead is not None and lead >= ramp.at - (first + 1) * sim.sync_s))
    return out


def single_replica_p95(trace: Trace, profile: ReplicaProfile) -> tuple[float, int]:
    """p95 TTFT of one always-ready replica fed ``trace`` behind the edge's cap (unfinished
    requests count as infinitely late), and how many requests it served."""
    replica = Replica("calib", profile, StepTimes(profile), 0.0, 0.0, 1)
    replica.state = "ready"
    edge = EdgeQueue(len(trace))
    out: list = []
    end = trace.arrivals[-1] if trace.arrivals else 0.0
    for k, a in enumerate(trace.arrivals):
        edge.queue.append((a, trace.prompts[k], trace.outputs[k], k))
    replica.advance(end + 60.0, out, edge)
    values = sorted(v for _, v, _ in out)
    values += [math.inf] * (len(trace) - len(values))
    return (values[min(len(values) - 1, int(0.95 * len(values)))] if values else 0.0), len(out)
