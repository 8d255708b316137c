"""The queueing model: one pool's requests against the capacity of its ready replicas.

Per time step (10 s) a pool gets its Poisson arrival count and the request rate its ready
replicas serve inside the SLO (``profiles.Capacity.qps`` per replica, summed; data-parallel
copies count one each). Arrivals are spread evenly over the step.

* Served on arrival (no backlog ahead): inside the SLO with the probability the calibration
  measured for one replica at that load (``Capacity.within`` at u = arrivals / capacity), and
  with that load's p95 TTFT as its TTFT sample.
* Above capacity, requests queue and are served at the replicas' rate in later one-second
  sub-steps, deadline-first as the edge's queue serves them: those that can still meet the SLO
  first, oldest first, then those already past it, oldest first. A queued request's TTFT is its
  wait plus the median TTFT of a saturated replica, inside the SLO when that is at most the SLO.
  The TTFT gauge the autoscaler reads leaves out requests served past their deadline, as the
  edge's signal does (``dataplane/edge/pipeline/stream.py``): the backlog they waited in is
  reported as queued requests.
* With no ready replica at all, requests wait (the edge holds them, as it does for a pool at
  zero) and count as cold-start waits; they are served once a replica is ready.
* A request still waiting after ``timeout_s`` (300 s) is dropped by its client: a miss.

Every contender is measured by the same model, so the comparison is about how many replicas
each one has ready where and when, not about the engine.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.fleet.profiles import Capacity

SUB_S = 1.0


@dataclass
class StepResult:
    served: float
    utilization: float  # served / capacity over the step (1.0 while a backlog is worked off)
    backlog: float  # requests still waiting at the end of the step


class PoolQueue:
    def __init__(self, slo_s: float, timeout_s: float = 300.0, window_s: float = 60.0,
                 phase_of: Callable[[float], str] | None = None):
        self.slo_s = slo_s
        self.timeout_s = timeout_s
        self.window_s = window_s
        self.cohorts: deque[list[float]] = deque()  # [arrival time, requests]
        self.backlog = 0.0
        self.requests = 0
        self.within = 0.0
        self.cold_waits = 0
        self.dropped = 0.0
        self.samples: deque[tuple[float, float, float]] = deque()  # (t, ttft, requests) for the p95 gauge
        self.count_from = 0.0  # requests that arrive earlier (the warm-up) are not accounted
        # Requests and those inside the SLO by the phase of the load at their arrival (a burst,
        # the minutes after one, steady): where the misses are, not only how many.
        self.phase_of = phase_of
        self.requests_by_phase: dict[str, float] = defaultdict(float)
        self.within_by_phase: dict[str, float] = defaultdict(float)

    # -- the gauge the autoscaler reads
    def ttft_p95(self, now: float, min_requests: int = 20) -> float | None:
        while self.samples and self.samples[0][0] < now - self.window_s:
            self.samples.popleft()
        total = sum(n for _, _, n in self.samples)
        if total < min_requests:
            return None
        acc = 0.0
        for _, v, n in sorted(self.samples, key=lambda s: s[1]):
            acc += n
            if acc >= 0.95 * total:
                return v
        return None

    def _sample(self, t: float, ttft: float, n: float) -> None:
        if n > 0:
            self.samples.append((t, ttft, n))

    def _count(self, arrived: float, ok: float) -> None:
        if arrived >= self.count_from:
            self.within += ok
            if self.phase_of is not None:
                self.within_by_phase[self.phase_of(arrived)] += ok

    def step(self, t: float, dt: float, arrivals: int, servers: Sequence[tuple[int, Capacity]]) -> StepResult:
        """Serve [t, t + dt): ``servers`` are (ready replicas, their capacity) per GPU type."""
        counting = t >= self.count_from
        if counting:
            self.requests += arrivals
            if self.phase_of is not None and arrivals:
                self.requests_by_phase[self.phase_of(t + dt / 2)] += arrivals
        rate = sum(k * c.qps for k, c in servers)
        if rate <= 0:
            if arrivals:
                if counting:
                    self.cold_waits += arrivals
                self.cohorts.append([t + dt / 2, float(arrivals)])
                self.backlog += arrivals
            self._expire(t + dt)
            return StepResult(0.0, 0.0, self.backlog)
        u = arrivals / (rate * dt)
        if self.backlog <= 0 and u <= 1.0:
            within = sum(k * c.qps * c.at(c.within, u) for k, c in servers) / rate
            p95 = sum(k * c.qps * c.at(c.p95_ttft, u) for k, c in servers) / rate
            self._count(t, arrivals * within)
            self._sample(t + dt, p95, arrivals)
            return StepResult(float(arrivals), u, 0.0)
        # Backlog or overload: deadline-first in one-second sub-steps.
        sat_ttft = sum(k * c.qps * c.p50_ttft[-1] for k, c in servers) / rate
        within_free = sum(k * c.qps * c.at(c.within, min(1.0, u)) for k, c in servers) / rate
        p95_free = sum(k * c.qps * c.at(c.p95_ttft, min(1.0, u)) for k, c in servers) / rate
        subs = max(1, round(dt / SUB_S))
        sub = dt / subs
        per_sub = arrivals / subs
        served = 0.0
        for j in range(subs):
            start = t + j * sub
            if per_sub:
                self.cohorts.append([start + sub / 2, per_sub])
                self.backlog += per_sub
            room = rate * sub
            used = 0.0
            # Deadline order, as the edge's queue serves (dataplane/edge/fairness.py): cohorts that
            # can still meet the SLO first, oldest first, then those past it, oldest first.
            latest_ok = start - (self.slo_s - sat_ttft)  # arrived earlier: too late already
            fresh: list[list[float]] = []
            late: list[list[float]] = []
            for c in self.cohorts:
                (fresh if c[0] >= latest_ok else late).append(c)
            for cohort in fresh + late:
                if room <= 1e-9:
                    break
                x = min(cohort[1], room)
                mid = start + (used + x / 2) / rate
                wait = mid - cohort[0]
                if wait <= 0:
                    self._count(cohort[0], x * within_free)
                    self._sample(start, p95_free, x)
                else:
                    ttft = wait + sat_ttft
                    if ttft <= self.slo_s:
                        self._count(cohort[0], x)
                    if cohort[0] >= latest_ok:  # as the edge reports TTFT to the autoscaler
                        self._sample(start, ttft, x)
                cohort[1] -= x
                room -= x
                used += x
                served += x
                self.backlog -= x
            if any(c[1] <= 1e-9 for c in self.cohorts):
                self.cohorts = deque(c for c in self.cohorts if c[1] > 1e-9)
            if self.backlog < 1e-9:
                self.backlog = 0.0
        self._expire(t + dt)
        return StepResult(served, min(1.0, served / (rate * dt)), self.backlog)

    def _expire(self, now: float) -> None:
        while self.cohorts and now - self.cohorts[0][0] > self.timeout_s:
            arrived, n = self.cohorts.popleft()
            self.backlog -= n
            if arrived >= self.count_from:
                self.dropped += n
        if self.backlog < 1e-9:
            self.backlog = 0.0

    def close(self) -> None:
        """End of the day: whatever still waits is a miss."""
        self.dropped += sum(n for arrived, n in self.cohorts if arrived >= self.count_from)
        self.cohorts.clear()
        self.backlog = 0.0
