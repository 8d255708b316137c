"""Routing policies behind one interface: pick a replica among candidates that have room.

Policies are pure over their inputs (candidates with live load, the prefix index); the router
(``router.py``) does the filtering (health, breakers, the capacity guard) and the bookkeeping.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

from dataplane.edge.catalog import Replica
from dataplane.edge.prefix import PrefixIndex


@dataclass(slots=True)
class ReplicaLoad:
    """What this edge has in flight on one replica."""

    inflight: int = 0
    inflight_tokens: int = 0
    pending_prefill_tokens: int = 0  # uncached prompt tokens of requests that have not started streaming
    # monotonic time this edge last saw the replica produce output (a first byte, a streamed chunk,
    # a finished answer): passive health, which the active probe defers to (see health.judge)
    last_progress: float = float("-inf")
    busy_since: float = float("-inf")  # when ``inflight`` last rose from 0: a stall is timed from here at most


@dataclass(slots=True)
class Candidate:
    replica: Replica
    load: ReplicaLoad
    rtt_ms: float
    capacity: int  # most concurrent requests the edge sends to this replica
    bias_ms: float = 0.0  # how much slower than predicted this replica has recently been (see Router)
    degraded: str = ""  # why the router offered it past its health filter (router.DEGRADED_*), or ""

    @property
    def running(self) -> int:
        """Best estimate of requests on the replica: ours (exact) or what it reported (covers other edges)."""
        return max(self.load.inflight, self.replica.num_running_reqs + self.replica.num_queue_reqs)

    @property
    def has_room(self) -> bool:
        return self.running < self.capacity

    @property
    def utilisation(self) -> float:
        return self.running / max(1, self.capacity)


@dataclass(slots=True)
class RouteRequest:
    hashes: list[int]
    prompt_tokens: int
    prompt_chars: int
    tenant_id: str = ""

    def cached_tokens(self, index: PrefixIndex, replica_id: str, now: float) -> int:
        """Prompt tokens a replica is predicted to hold: the matched share of the prompt's characters
        applied to the token estimate (both sides in the same, calibrated units)."""
        blocks = index.matched_blocks(replica_id, self.hashes, now)
        if not blocks or self.prompt_chars <= 0:
            return 0
        return int(self.prompt_tokens * min(1.0, blocks * index.block_chars / self.prompt_chars))


@dataclass(slots=True)
class Decision:
    replica: Replica
    policy: str
    predicted_ttft_ms: float = 0.0
    predicted_cached_tokens: int = 0


class RoutingPolicy(Protocol):
    name: str

    def choose(self, req: RouteRequest, candidates: list[Candidate], now: float) -> Decision | None:
        """``candidates`` all have room and are non-empty; return the pick."""
        ...


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, req: RouteRequest, candidates: list[Candidate], now: float) -> Decision | None:
        ordered = sorted(candidates, key=lambda c: c.replica.id)
        return Decision(ordered[next(self._counter) % len(ordered)].replica, self.name)


class LeastLoad:
    name = "least_load"

    def choose(self, req: RouteRequest, candidates: list[Candidate], now: float) -> Decision | None:
        best = min(candidates, key=lambda c: (c.utilisation, c.load.inflight_tokens, c.rtt_ms))
        return Decision(best.replica, self.name)


class TtftModel:
    """Cost coefficients of the TTFT prediction, calibrated online from observed TTFTs."""

    def __init__(self, prefill_ms_per_token: float, decode_ms_per_running: float) -> None:
        self.prefill_ms_per_token = prefill_ms_per_token
        self.decode_ms_per_running = decode_ms_per_running
        self._initial = prefill_ms_per_token

    def predict(self, rtt_ms: float, backlog_tokens: int, running: int) -> float:
        return rtt_ms + backlog_tokens * self.prefill_ms_per_token + running * self.decode_ms_per_running

    def observe(self, rtt_ms: float, backlog_tokens: int, observed_ttft_ms: float) -> None:
        """Nudge the per-token prefill cost towards what the replica really took."""
        if backlog_tokens < 256 or observed_ttft_ms <= rtt_ms:
            return  # too small to say anything about per-token cost
        sample = (observed_ttft_ms - rtt_ms) / backlog_tokens
        self.prefill_ms_per_token += 0.05 * (sample - self.prefill_ms_per_token)
        lo, hi = self._initial / 100, self._initial * 100
        self.prefill_ms_per_token = min(hi, max(lo, self.prefill_ms_per_token))


class PredictedTtft:
    """Predicted time to first token = RTT + queueing (prefill backlog the edge has sent there and
    not yet seen start, plus the running batch) + prefill of the prompt tokens that replica has not
    cached. The minimum wins: cache affinity and load balance in one currency, so a hot prefix
    stays put until its replica's backlog costs more than recomputing the prefix elsewhere."""

    name = "predicted_ttft"

    def __init__(self, index: PrefixIndex, model: TtftModel, uncached_penalty: float = 1.0,
                 balance_rel: float = 1.5, balance_abs: int = 16) -> None:
        self.index = index
        self.model = model
        # "Sticky until saturated": a replica running more than balance_rel x the mean (+ balance_abs)
        # is not offered while others are not; locality then picks among the rest. Unlike dropping to
        # least-load, the cache still decides among the replicas that remain.
        self.balance_rel = balance_rel
        self.balance_abs = balance_abs
        # The prompt's own uncached prefill also delays every later request on that replica (and
        # duplicates a prefix in another KV cache). Scoring it (1 + penalty) times keeps a prefix on
        # its replica until the backlog there really costs more, instead of flipping on near-ties.
        self.uncached_penalty = uncached_penalty

    def estimate(self, req: RouteRequest, cand: Candidate, now: float) -> tuple[float, float, int]:
        """(predicted TTFT ms, routing score, predicted cached tokens) for one candidate."""
        cached = req.cached_tokens(self.index, cand.replica.id, now)
        uncached = req.prompt_tokens - cached
        ttft = self.model.predict(cand.rtt_ms, cand.load.pending_prefill_tokens + uncached, cand.running)
        ttft = max(cand.rtt_ms, ttft + cand.bias_ms)
        # Computing new prefix blocks on a replica whose cache is full evicts someone else's prefix
        # (a future miss there); on an emptier replica it costs nothing. This spreads tenants' prefixes
        # evenly across the fleet's KV instead of by arrival-time load alone.
        eviction = self.index.occupancy(cand.replica.id)
        score = ttft + (self.uncached_penalty + eviction) * uncached * self.model.prefill_ms_per_token
        return ttft, score, cached

    def balanced(self, candidates: list[Candidate]) -> list[Candidate]:
        if len(candidates) < 2:
            return candidates
        mean = sum(c.running for c in candidates) / len(candidates)
        limit = self.balance_rel * mean + self.balance_abs
        kept = [c for c in candidates if c.running <= limit]
        return kept or candidates

    def choose(self, req: RouteRequest, candidates: list[Candidate], now: float) -> Decision | None:
        best: tuple[float, float, str] | None = None
        best_cand, best_ttft, best_cached = None, 0.0, 0
        for cand in self.balanced(candidates):
            ttft, score, cached = self.estimate(req, cand, now)
            key = (score, cand.utilisation, cand.replica.id)
            if best is None or key < best:
                best, best_cand, best_ttft, best_cached = key, cand, ttft, cached
        assert best_cand is not None
        return Decision(best_cand.replica, self.name, best_ttft, best_cached)


POLICY_NAMES = ("predicted_ttft", "least_load", "round_robin")


def make_policy(name: str, index: PrefixIndex, model: TtftModel, uncached_penalty: float = 1.0,
                balance_rel: float = 1.5, balance_abs: int = 16) -> RoutingPolicy:
    if name == "round_robin":
        return RoundRobin()
    if name == "least_load":
        return LeastLoad()
    if name == "predicted_ttft":
        return PredictedTtft(index, model, uncached_penalty, balance_rel, balance_abs)
    raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
