"""A fast replica model for day-long simulations, timed by ``dataplane.sim.timing``.

Each replica behaves like an SGLang scheduler at the level of whole steps: while requests
wait and fit (batch slots, KV pool), it runs an extend (prefill) batch of up to
``chunk_tokens`` prompt tokens, which pauses decoding; otherwise it runs decode steps for the
whole running batch. Runs of decode steps between events (an arrival, a completion, the
sync point) are taken in one go, so a day of traffic costs a few operations per request
instead of one per 20 ms step.

TTFT = time waiting in the replica's queue + the extend batch it joined, counted from the
request's arrival at the edge (so it includes any wait in the edge's queue). A request's first
token comes out of its prefill; the rest take one decode step each.

The edge caps each replica at its batch slots (``dataplane/edge/router.py::capacity``: in-flight
requests, queued or running, at most ``max_running_requests``) and holds the rest in its own
queue (``EdgeQueue``). A replica given that queue pulls from it whenever one of its requests
finishes and it has a slot free, at that instant, as the edge dispatches on a release.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from functools import cache, lru_cache

from dataplane.sim import timing


@dataclass(frozen=True)
class ReplicaProfile:
    """What one replica of the pool is: model, GPU, parallelism and engine limits."""

    model: str = "llama-3.1-70b"
    gpu: str = "h100"
    tp: int = 2
    quantization: str | None = "fp8"
    max_running_requests: int = 128
    chunk_tokens: int = 8192
    download_gbps: float = 10.0

    @property
    def kv_capacity_tokens(self) -> int:
        return timing.kv_capacity_tokens(_model(self.model), _gpu(self.gpu), self.tp,
                                         quantization=self.quantization)

    @property
    def model_ready_seconds(self) -> float:
        return timing.model_ready_seconds(_model(self.model), _gpu(self.gpu), self.tp, self.quantization,
                                          download_gbps=self.download_gbps)


@cache
def _model(name: str) -> timing.ModelProfile:
    return timing.get_model(name)


@cache
def _gpu(name: str) -> timing.GpuProfile:
    return timing.get_gpu(name)


class EdgeQueue:
    """The edge's queue for one pool: requests no replica had a free slot for, oldest first
    (one tenant, so the fair queue is FIFO), and when each left it for a replica."""

    __slots__ = ("dispatched", "queue", "waits")

    def __init__(self, n: int):
        self.queue: deque = deque()  # (arrival, prompt, output, request index)
        self.dispatched: list[float | None] = [None] * n  # time each request reached an engine
        self.waits: list[float] = []  # time in the queue of the requests that left it, not yet collected


class StepTimes:
    """Memoised step durations; token counts are bucketed so the caches stay small."""

    def __init__(self, profile: ReplicaProfile):
        model, gpu = _model(profile.model), _gpu(profile.gpu)
        self._prefill = lru_cache(maxsize=None)(
            lambda bucket: timing.prefill_seconds(model, gpu, bucket * 64, 0, profile.tp, profile.quantization))
        self._decode = lru_cache(maxsize=None)(
            lambda batch, ctx_bucket: timing.decode_step_seconds(
                model, gpu, batch, ctx_bucket * 4096, profile.tp, profile.quantization))

    def prefill(self, tokens: int) -> float:
        return self._prefill(max(1, round(tokens / 64)))

    def decode(self, batch: int, context_tokens: int) -> float:
        return self._decode(batch, max(1, round(context_tokens / 4096)))


class Replica:
    __slots__ = (
        "cap",
        "chunk",
        "clock",
        "completed",
        "context",
        "decoded",
        "gpus",
        "kv_capacity",
        "kv_used",
        "launched_at",
        "max_running",
        "ready_at",
        "replica_id",
        "running",
        "spot",
        "state",
        "times",
        "waiting",
    )

    def __init__(self, replica_id: str, profile: ReplicaProfile, times: StepTimes, launched_at: float,
                 ready_at: float, gpus: int, spot: bool = False):
        self.replica_id = replica_id
        self.times = times
        self.kv_capacity = profile.kv_capacity_tokens
        self.max_running = profile.max_running_requests
        self.cap = profile.max_running_requests  # the edge's in-flight cap (capacity_factor 1.0)
        self.chunk = profile.chunk_tokens
        self.launched_at = launched_at
        self.ready_at = ready_at
        self.gpus = gpus
        self.spot = spot
        self.state = "starting"
        self.clock = ready_at
        self.waiting: deque = deque()  # [arrival, prompt, output, request index]
        self.running: list = []  # heap of (finish decode counter, kv tokens, request index)
        self.decoded = 0  # decode steps done so far
        self.kv_used = 0
        self.context = 0  # KV tokens of the running batch
        self.completed = 0

    # -- load as the router and the autoscaler see it
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def queued(self, now: float) -> int:
        return sum(1 for w in self.waiting if w[0] <= now)

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def submit(self, arrival: float, prompt: int, output: int, index: int) -> None:
        self.waiting.append((arrival, prompt, output, index))

    def _fits(self, prompt: int, output: int) -> bool:
        return len(self.running) < self.max_running and self.kv_used + prompt + output <= self.kv_capacity

    def has_slot(self) -> bool:
        return len(self.waiting) + len(self.running) < self.cap

    def _pull(self, edge: EdgeQueue) -> None:
        """Take queued requests from the edge (those that have arrived) while a slot is free."""
        queue, waiting, clock = edge.queue, self.waiting, self.clock
        while queue and queue[0][0] <= clock and len(waiting) + len(self.running) < self.cap:
            item = queue.popleft()
            edge.dispatched[item[3]] = clock
            edge.waits.append(clock - item[0])
            # Behind what this engine already holds, ahead of what is still to arrive.
            position = len(waiting)
            while position and waiting[position - 1][0] > clock:
                position -= 1
            waiting.insert(position, item)

    def advance(self, until: float, ttft_out: list, edge: EdgeQueue | None = None) -> None:
        """Run the engine up to ``until``; first tokens go to ``ttft_out`` as
        (request index, ttft, time of the first token). With ``edge``, free slots pull from it."""
        times = self.times
        while self.clock < until:
            if edge is not None and edge.queue and len(self.waiting) + len(self.running) < self.cap:
                self._pull(edge)
            waiting = self.waiting
            head_arrived = waiting and waiting[0][0] <= self.clock
            if head_arrived and self._fits(waiting[0][1], waiting[0][2]):
                tokens = 0
                batch = []
                while waiting and waiting[0][0] <= self.clock and self._fits(waiting[0][1], waiting[0][2]):
                    if batch and tokens + waiting[0][1] > self.chunk:
                        break
                    arrival, prompt, output, index = waiting.popleft()
                    tokens += prompt
                    self.kv_used += prompt + output
                    self.context += prompt
                    batch.append((arrival, prompt, output, index))
                self.clock += times.prefill(tokens)
                for arrival, prompt, output, index in batch:
                    ttft = self.clock - arrival
                    ttft_out.append((index, ttft, self.clock))
                    heapq.heappush(self.running, (self.decoded + max(0, output - 1), prompt + output, index))
                self._finish_done()
                continue
            # The next arrival this engine will see: its own queue's, or the edge's if it has room.
            upcoming = waiting[0][0] if waiting and waiting[0][0] > self.clock else math.inf
            if edge is not None and edge.queue and self.has_slot():
                upcoming = min(upcoming, edge.queue[0][0])
            if self.running:
                step = times.decode(len(self.running), self.context)
                to_finish = max(1, self.running[0][0] - self.decoded)
                horizon = min(until, upcoming)
                to_horizon = max(1, math.ceil((horizon - self.clock) / step))
                k = min(to_finish, to_horizon)
                self.clock += k * step
                self.decoded += k
                self.context += k * len(self.running)
                self._finish_done()
            elif upcoming > self.clock and upcoming < math.inf:
                self.clock = min(until, upcoming)
            else:
                # Idle, or blocked with nothing running (a request larger than the KV pool).
                self.clock = until

    def _finish_done(self) -> None:
        running = self.running
        while running and running[0][0] <= self.decoded:
            _, kv, _ = heapq.heappop(running)
            self.kv_used -= kv
            self.context -= kv  # a finished request's context has grown to its full reservation
            self.completed += 1
        self.context = max(0, self.context) if running else 0
