"""A fast replica model for day-long simulations, timed by ``dataplane.sim.timing``.

Each replica behaves like an SGLang scheduler at the level of whole steps: while requests
wait and fit (batch slots, KV pool), it runs an extend (prefill) batch of up to
``chunk_tokens`` prompt tokens, which pauses decoding; otherwise it runs decode steps for the
whole running batch. Runs of decode steps between events (an arrival, a completion, the
sync point) are taken in one go, so a day of traffic costs a few operations per request
instead of one per 20 ms step.

TTFT = time waiting in the replica's queue + the extend batch it joined. A request's first
token comes out of its prefill; the rest take one decode step each.
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

    def advance(self, until: float, ttft_out: list) -> None:
        """Run the engine up to ``until``; first tokens go to ``ttft_out`` as
        (request index, ttft, time of the first token)."""
        times = self.times
        while self.clock < until:
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
            elif self.running:
                step = times.decode(len(self.running), self.context)
                to_finish = max(1, self.running[0][0] - self.decoded)
                horizon = until
                if waiting and waiting[0][0] > self.clock:
                    horizon = min(horizon, waiting[0][0])
                to_horizon = max(1, math.ceil((horizon - self.clock) / step))
                k = min(to_finish, to_horizon)
                self.clock += k * step
                self.decoded += k
                self.context += k * len(self.running)
                self._finish_done()
            elif waiting and waiting[0][0] > self.clock:
                self.clock = min(until, waiting[0][0])
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
