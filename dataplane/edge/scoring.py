"""Routing as filters, weighted scorers and a picker (llm-d's scheduler profile, SGLang gateway's
policies split into their signals).

A *scorer* turns one candidate replica into a cost in milliseconds of expected client wait (lower
is better), so that scorers add up in one currency. A *profile* is a list of weighted scorers; the
picker takes the candidate with the lowest weighted sum after the filters (today one: replicas
running far above the mean are not offered while others are not). Ties go to the less utilised,
then to the lower replica id, so a decision is a pure function of its inputs.

The default profile, ``predicted_ttft:1,prefix:1``, is the edge's one-currency predicted time to
first token: RTT + queueing + the uncached prefill, plus the cost of recomputing (and possibly
evicting) prefix blocks there. A new signal is one class here or anywhere else, registered with
``register``; ``EdgeSettings.routing_profile`` picks and weighs them without code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dataplane.edge.policies import Candidate, Decision, RouteRequest, TtftModel
from dataplane.edge.prefix import PrefixIndex


@dataclass(slots=True)
class Estimate:
    """What scorers share about one candidate for one request, computed once."""

    cached_tokens: int
    uncached_tokens: int
    ttft_ms: float  # the predicted time to first token, bias included


@dataclass(frozen=True)
class ScoringContext:
    """What a scorer may be built from: the edge's prefix index and its TTFT model."""

    index: PrefixIndex
    model: TtftModel
    uncached_penalty: float = 1.0


class Scorer(Protocol):
    name: str

    def score(self, req: RouteRequest, cand: Candidate, est: Estimate, now: float) -> float:
        """This candidate's cost in ms of expected wait; lower is better."""
        ...


class PredictedTtftScorer:
    """The request's predicted TTFT there: RTT + the prefill backlog the edge has sent and not seen
    start + its own uncached prefill + the running batch's share of each step, + the replica's
    measured bias (slower than predicted lately, or slow to answer its health probe)."""

    name = "predicted_ttft"

    def score(self, req: RouteRequest, cand: Candidate, est: Estimate, now: float) -> float:
        return est.ttft_ms


class PrefixScorer:
    """Recomputing prefix blocks a replica lacks delays every later request there and duplicates
    the prefix in another KV cache; on a full cache it evicts someone else's prefix. Scoring that
    keeps a prefix on its replica until the backlog there really costs more, and spreads new
    prefixes to emptier caches."""

    name = "prefix"

    def __init__(self, ctx: ScoringContext) -> None:
        self.index, self.model, self.penalty = ctx.index, ctx.model, ctx.uncached_penalty

    def score(self, req: RouteRequest, cand: Candidate, est: Estimate, now: float) -> float:
        eviction = self.index.occupancy(cand.replica.id)
        return (self.penalty + eviction) * est.uncached_tokens * self.model.prefill_ms_per_token


class LoadScorer:
    """Utilisation of the replica's slots, as the ms a fully busy replica would add: one running
    request's decode share times the slots in use."""

    name = "load"

    def __init__(self, ctx: ScoringContext) -> None:
        self.model = ctx.model

    def score(self, req: RouteRequest, cand: Candidate, est: Estimate, now: float) -> float:
        return cand.running * self.model.decode_ms_per_running


class QueueScorer:
    """The prefill backlog alone (what the edge has sent there and not seen start), in ms."""

    name = "queue"

    def __init__(self, ctx: ScoringContext) -> None:
        self.model = ctx.model

    def score(self, req: RouteRequest, cand: Candidate, est: Estimate, now: float) -> float:
        return cand.load.pending_prefill_tokens * self.model.prefill_ms_per_token


SCORERS: dict[str, Callable[[ScoringContext], Scorer]] = {
    "predicted_ttft": lambda ctx: PredictedTtftScorer(),
    "prefix": PrefixScorer,
    "load": LoadScorer,
    "queue": QueueScorer,
}
DEFAULT_PROFILE = "predicted_ttft:1,prefix:1"


def register(name: str, factory: Callable[[ScoringContext], Scorer]) -> None:
    """Add a scorer that profiles can name (one line per new signal)."""
    if name in SCORERS:
        raise ValueError(f"a scorer named {name!r} exists already")
    SCORERS[name] = factory


def parse_profile(text: str) -> list[tuple[str, float]]:
    """``"predicted_ttft:1,prefix:0.5"`` → ``[("predicted_ttft", 1.0), ("prefix", 0.5)]``; a bare name weighs 1."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, weight = part.partition(":")
        if name not in SCORERS:
            raise ValueError(f"unknown scorer {name!r} in routing profile; known: {', '.join(sorted(SCORERS))}")
        value = float(weight) if weight else 1.0
        if value < 0:
            raise ValueError(f"scorer weights are not negative: {part!r}")
        out.append((name, value))
    if not out:
        raise ValueError("a routing profile needs at least one scorer")
    return out


class ScoredPicker:
    """The ``predicted_ttft`` routing policy: filter, score with the profile, pick the lowest."""

    name = "predicted_ttft"

    def __init__(self, ctx: ScoringContext, profile: str = DEFAULT_PROFILE, balance_rel: float = 1.5,
                 balance_abs: int = 16) -> None:
        self.ctx = ctx
        self.scorers = [(SCORERS[name](ctx), weight) for name, weight in parse_profile(profile)]
        # "Sticky until saturated": a replica running more than balance_rel x the mean (+ balance_abs)
        # is not offered while others are not; the scorers then pick among the rest, so locality still
        # decides among the replicas that remain (unlike falling back to least-load).
        self.balance_rel = balance_rel
        self.balance_abs = balance_abs

    def balanced(self, candidates: list[Candidate]) -> list[Candidate]:
        if len(candidates) < 2:
            return candidates
        mean = sum(c.running for c in candidates) / len(candidates)
        limit = self.balance_rel * mean + self.balance_abs
        kept = [c for c in candidates if c.running <= limit]
        return kept or candidates

    def estimate(self, req: RouteRequest, cand: Candidate, now: float) -> Estimate:
        cached = req.cached_tokens(self.ctx.index, cand.replica.id, now)
        uncached = req.prompt_tokens - cached
        ttft = self.ctx.model.predict(cand.rtt_ms, cand.load.pending_prefill_tokens + uncached, cand.running)
        return Estimate(cached, uncached, max(cand.rtt_ms, ttft + cand.bias_ms))

    def choose(self, req: RouteRequest, candidates: list[Candidate], now: float) -> Decision | None:
        best: tuple[float, float, str] | None = None
        best_cand, best_est = None, None
        for cand in self.balanced(candidates):
            est = self.estimate(req, cand, now)
            total = sum(weight * scorer.score(req, cand, est, now) for scorer, weight in self.scorers)
            key = (total, cand.utilisation, cand.replica.id)
            if best is None or key < best:
                best, best_cand, best_est = key, cand, est
        assert best_cand is not None and best_est is not None
        return Decision(best_cand.replica, self.name, best_est.ttft_ms, best_est.cached_tokens)
