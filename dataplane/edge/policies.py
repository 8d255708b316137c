"""Routing policies behind one interface: pick a replica among candidates that have room.

Policies are pure over their inputs (candidates with live load, the prefix index); the router
(``router.py``) does the filtering (health, breakers, the capacity guard) and the bookkeeping.
The default policy, ``predicted_ttft``, is the scored picker of ``scoring.py``; round robin and
least load stay for comparison.
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
    batch_inflight: int = 0  # of ``inflight``, batch-class requests
    interactive_prefilling: int = 0  # interactive requests dispatched here that have no first byte yet
    inflight_tokens: int = 0
    pending_prefill_tokens: int = 0  # uncached prompt tokens of requests that have not started streaming
    # until when (monotonic s) the batch prompts sent here are predicted to occupy the replica's
    # prefill, one after another (``Router.choose``, ``batch_prefill_backlog_ms``)
    batch_prefill_until: float = float("-inf")
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
    max_tokens: int = 0  # the most it may generate (0: not known); KV admission reserves for its output

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
    """Cost coefficients of the TTFT prediction, calibrated online from observed TTFTs (one per-token
    prefill cost for the fleet). Learning it per replica was tried and reverted: at saturation the
    engines' own queueing inflates a busy replica's samples, the edge then steers away from it,
    the others saturate in turn, and the fleet collapsed (bench/edge/README.md, 2026-12-02)."""

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


POLICY_NAMES = ("predicted_ttft", "least_load", "round_robin")


def make_policy(name: str, index: PrefixIndex, model: TtftModel, uncached_penalty: float = 1.0,
                balance_rel: float = 1.5, balance_abs: int = 16, profile: str = "") -> RoutingPolicy:
    """``predicted_ttft`` is the scored picker (``scoring.py``) with ``profile``, or its default."""
    if name == "round_robin":
        return RoundRobin()
    if name == "least_load":
        return LeastLoad()
    if name == "predicted_ttft":
        from dataplane.edge import scoring  # (scoring builds on this module's types)

        return scoring.ScoredPicker(scoring.ScoringContext(index, model, uncached_penalty),
                                    profile or scoring.DEFAULT_PROFILE, balance_rel, balance_abs)
    raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
