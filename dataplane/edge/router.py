"""The routing service: filters candidates (health, region health, breakers, capacity guard), asks
the policy, and keeps the live per-replica bookkeeping the policies read."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dataplane.edge.breaker import CircuitBreaker, RetryBudget
from dataplane.edge.catalog import Catalog, Replica
from dataplane.edge.kv import PinnedKv, loose_tokens
from dataplane.edge.policies import Candidate, Decision, ReplicaLoad, RouteRequest, RoutingPolicy, TtftModel
from dataplane.edge.prefix import PrefixIndex
from dataplane.edge.settings import EdgeSettings


@dataclass(slots=True)
class Ticket:
    """One dispatch of one request to one replica; closes exactly once."""

    replica: Replica
    decision: Decision
    reserved_tokens: int
    uncached_tokens: int
    backlog_at_dispatch: int
    rtt_ms: float
    started: bool = False
    closed: bool = False
    tenant_id: str = ""
    prompt_tokens: int = 0
    bias_at_dispatch: float = 0.0
    batch: bool = False  # batch-class: an engine with priority preemption gives its slot up
    dispatched_at: float = 0.0  # monotonic s
    kv_hashes: list[int] | None = None  # the prompt blocks it pins on its replica (None: not counted)
    kv_loose_tokens: int = 0


@dataclass(slots=True)
class HealthState:
    healthy: bool = True
    consecutive_failures: int = 0
    rtt_ms: float | None = None  # measured, used when the snapshot has none for the region
    # False once a probe could not even connect: the process is gone. Such a replica is never a
    # fallback candidate; one that merely failed its probes still is (see ``eligible``).
    reachable: bool = True
    # Set by a probe that timed out while the replica kept making progress: slow, not dead. Scored as
    # that much extra predicted TTFT until a probe answers in time again.
    slow_penalty_ms: float = 0.0


# Verdicts of one health probe (``dataplane.edge.health.judge`` decides which).
PROBE_OK, PROBE_SLOW, PROBE_FAILED, PROBE_DEAD = "ok", "slow", "failed", "dead"
# Why a candidate list was widened past the healthy replicas of healthy regions ("" when it was not).
DEGRADED_FAILING_REGION, DEGRADED_UNHEALTHY = "failing_region", "unhealthy"


def reserved_slots(capacity: int, share: float, interactive_peak: float | None) -> float:
    """Slots batch work leaves to interactive work on a replica of ``capacity``."""
    most = capacity * share
    return most if interactive_peak is None else min(most, math.ceil(interactive_peak) + 1)


@dataclass
class Router:
    settings: EdgeSettings
    policy: RoutingPolicy
    index: PrefixIndex
    ttft_model: TtftModel
    loads: dict[str, ReplicaLoad] = field(default_factory=dict)
    breakers: dict[str, CircuitBreaker] = field(default_factory=dict)
    health: dict[str, HealthState] = field(default_factory=dict)
    retry_budget: RetryBudget = field(default_factory=RetryBudget)
    # replica id -> (EWMA of observed - predicted TTFT in ms, when last updated). It captures what the
    # model does not (a slow or CPU-starved host, a throttled GPU, a long batch) and fades with time so a
    # replica that was slow once is tried again.
    bias: dict[str, tuple[float, float]] = field(default_factory=dict)
    # replica id -> the KV cache this edge's requests in flight pin there (see kv.py)
    pinned: dict[str, PinnedKv] = field(default_factory=dict)
    # variant id -> EWMA of the tokens an answer generates: what KV admission reserves for an output
    # (up to its max_tokens), since most answers stop well before their limit; per variant, as models
    # answer at different lengths (and embeddings generate nothing)
    output_tokens: dict[str, float] = field(default_factory=dict)
    BIAS_ALPHA = 0.2
    OUTPUT_ALPHA = 0.05
    BIAS_FADE_S = 5.0

    def bias_ms(self, replica_id: str, now: float) -> float:
        value, at = self.bias.get(replica_id, (0.0, now))
        return value * math.exp(-(now - at) / self.BIAS_FADE_S)

    # ---- state per replica ----

    def load(self, replica_id: str) -> ReplicaLoad:
        load = self.loads.get(replica_id)
        if load is None:
            load = self.loads[replica_id] = ReplicaLoad()
        return load

    def breaker(self, replica_id: str) -> CircuitBreaker:
        br = self.breakers.get(replica_id)
        if br is None:
            br = self.breakers[replica_id] = CircuitBreaker(
                self.settings.breaker_failures, self.settings.breaker_cooldown_s)
        return br

    def health_of(self, replica_id: str) -> HealthState:
        st = self.health.get(replica_id)
        if st is None:
            st = self.health[replica_id] = HealthState()
        return st

    def pinned_kv(self, replica_id: str) -> PinnedKv:
        kv = self.pinned.get(replica_id)
        if kv is None:
            kv = self.pinned[replica_id] = PinnedKv()
        return kv

    def tokens_per_block(self) -> float:
        return self.index.block_chars / self.index.chars_per_token

    def kv_loose_tokens(self, req: RouteRequest, variant_id: str) -> int:
        """What ``req`` pins on a replica of ``variant_id`` besides its prompt's full blocks: its
        prompt's tail and the output it is expected to generate (the variant's typical answer,
        capped by the request's max_tokens)."""
        typical = self.output_tokens.get(variant_id)
        output = req.max_tokens if typical is None else min(req.max_tokens, math.ceil(typical))
        return loose_tokens(req.prompt_tokens, len(req.hashes), self.tokens_per_block(), output)

    def kv_fits(self, cand: Candidate, req: RouteRequest, loose: int) -> bool:
        fill = self.settings.kv_admission_fill
        kv_tokens = cand.replica.max_total_tokens
        if fill <= 0 or kv_tokens <= 0:
            return True
        kv = self.pinned.get(cand.replica.id)
        return kv is None or kv.fits(req.hashes, loose, self.tokens_per_block(), fill * kv_tokens)

    def on_catalog(self, catalog: Catalog) -> None:
        """Drop state of replicas that left; keep everything else across snapshot swaps."""
        live = set(catalog.replicas)
        self.index.retain(live)
        for table in (self.breakers, self.health):
            for rid in list(table):
                if rid not in live:
                    del table[rid]
        for rid in list(self.loads):
            if rid not in live and self.loads[rid].inflight == 0:
                del self.loads[rid]
        for rid in list(self.pinned):
            if rid not in live and not self.pinned[rid].requests:
                del self.pinned[rid]

    # ---- candidates ----

    def capacity(self, replica: Replica) -> int:
        if self.settings.max_inflight_per_replica:
            return self.settings.max_inflight_per_replica
        return max(1, int(replica.max_running_requests * self.settings.capacity_factor))

    def rtt_ms(self, catalog: Catalog, replica: Replica) -> float:
        configured = catalog.rtt_ms(replica.region)
        if configured is not None:
            return configured
        measured = self.health_of(replica.id).rtt_ms
        return self.settings.default_rtt_ms if measured is None else measured

    def failing_regions(self, replicas: list[Replica]) -> set[str]:
        """Regions where at least ``region_fail_fraction`` of this variant's replicas fail health checks."""
        total: dict[str, int] = {}
        bad: dict[str, int] = {}
        for r in replicas:
            total[r.region] = total.get(r.region, 0) + 1
            if not self.health_of(r.id).healthy:
                bad[r.region] = bad.get(r.region, 0) + 1
        return {reg for reg, n in bad.items() if n / total[reg] >= self.settings.region_fail_fraction}

    def eligible(self, catalog: Catalog, replicas: list[Replica], now: float,
                 exclude: frozenset[str] | set[str] = frozenset(),
                 exclude_regions: frozenset[str] | set[str] = frozenset(), degrade: bool = True) -> list[Candidate]:
        """The replicas a request may go to: healthy ones outside failing regions. When there are none
        and ``degrade`` is set, the edge does not fail closed: it widens to the healthy replicas of
        failing regions, then to replicas that fail their probes but still answer (slow or sick beats
        a certain 503). Replicas that cannot be reached, replicas whose breaker is open and the
        caller's exclusions never come back this way. Readiness asks with ``degrade=False``: a model
        served only by such replicas must not look healthy to DNS."""
        bad_regions = self.failing_regions(replicas)
        # One pass: each replica's health looked up once, candidates built for the first tier only;
        # the wider tiers are built only when the first is empty (on the hot path it rarely is).
        wider: tuple[list[tuple[Replica, HealthState]], list[tuple[Replica, HealthState]]] = ([], [])
        first: list[tuple[Replica, HealthState]] = []
        for r in replicas:
            if r.id in exclude or r.region in exclude_regions:
                continue
            st = self.health_of(r.id)
            if not st.reachable:
                continue
            if not st.healthy:
                wider[1].append((r, st))
            elif r.region in bad_regions:
                wider[0].append((r, st))
            else:
                first.append((r, st))
        tiers = (("", first), (DEGRADED_FAILING_REGION, wider[0]), (DEGRADED_UNHEALTHY, wider[1]))
        for degraded, tier in tiers if degrade else tiers[:1]:
            out = [Candidate(r, self.load(r.id), self.rtt_ms(catalog, r), self.capacity(r),
                             self.bias_ms(r.id, now) + st.slow_penalty_ms, degraded)
                   for r, st in tier if self.breaker(r.id).allows(now)]
            if out:
                return out
        return []

    def choose(self, req: RouteRequest, candidates: list[Candidate], now: float,
               keep_free: float = 0.0, preempts_batch: bool = False,
               interactive_peak: float | None = None) -> Decision | None:
        """The capacity guard: only replicas with room are offered to the policy: a free slot, and
        KV space for what the request would pin beside this edge's requests in flight there
        (``kv_fits``). None means every candidate is full and the request must wait in the admission
        queue. ``keep_free``: the share
        of each replica's slots this request may not take (batch work leaves it to interactive); with
        ``interactive_peak`` (the most interactive requests one replica recently held) it leaves that
        many plus one, up to the share. ``preempts_batch``: the engines preempt batch-class requests
        for this one (SGLang's priority preemption), so the slots this edge's batch requests hold
        count as free for it."""
        if keep_free > 0:
            # Nor does batch work start where an interactive request waits for its first token: the
            # engine would prefill them together (or the batch first), and the interactive TTFT pays.
            # With pacing, nor before the last batch prompt there has had its predicted prefill time:
            # an engine prefills the prompts waiting together, so a wave of them is one long step
            # that an interactive arrival must wait out (4 prompts of 250 tokens: 3.4x one).
            roomy = [c for c in candidates if not c.load.interactive_prefilling
                     and self.batch_opens_at(c.load) <= now
                     and c.running < c.capacity - reserved_slots(c.capacity, keep_free, interactive_peak)]
        elif preempts_batch:
            roomy = [c for c in candidates if c.running - c.load.batch_inflight < c.capacity]
        else:
            roomy = [c for c in candidates if c.has_room]
        if roomy and self.settings.kv_admission_fill > 0:
            loose = self.kv_loose_tokens(req, roomy[0].replica.variant_id)
            roomy = [c for c in roomy if self.kv_fits(c, req, loose)]
        if not roomy:
            return None
        return self.policy.choose(req, roomy, now)

    # ---- bookkeeping ----

    def dispatch(self, catalog: Catalog, decision: Decision, req: RouteRequest, reserved_tokens: int,
                 now: float, batch: bool = False) -> Ticket:
        replica = decision.replica
        load = self.load(replica.id)
        if decision.policy != "predicted_ttft":
            # Other policies do not look at the index; estimate the hit anyway for the metrics.
            decision.predicted_cached_tokens = req.cached_tokens(self.index, replica.id, now)
        uncached = max(0, req.prompt_tokens - decision.predicted_cached_tokens)
        ticket = Ticket(replica, decision, reserved_tokens, uncached, load.pending_prefill_tokens + uncached,
                        self.rtt_ms(catalog, replica), prompt_tokens=req.prompt_tokens,
                        bias_at_dispatch=self.bias_ms(replica.id, now) + self.health_of(replica.id).slow_penalty_ms,
                        batch=batch, dispatched_at=now)
        if load.inflight == 0:
            load.busy_since = now
        load.inflight += 1
        load.batch_inflight += batch
        if batch:
            load.batch_prefill_until = (max(now, load.batch_prefill_until)
                                        + uncached * self.ttft_model.prefill_ms_per_token / 1000)
        load.interactive_prefilling += not batch
        load.inflight_tokens += reserved_tokens
        load.pending_prefill_tokens += uncached
        if self.settings.kv_admission_fill > 0:
            ticket.kv_hashes, ticket.kv_loose_tokens = req.hashes, self.kv_loose_tokens(req, replica.variant_id)
            self.pinned_kv(replica.id).pin(req.hashes, ticket.kv_loose_tokens)
        self.breaker(replica.id).on_dispatch()
        self.index.record(replica.id, replica.max_total_tokens, req.hashes, now)
        return ticket

    def batch_opens_at(self, load: ReplicaLoad) -> float:
        """From when batch work may start on a replica again: once the batch prompts sent there
        have at most ``batch_prefill_backlog_ms`` of predicted prefill left (-inf: pacing off)."""
        backlog_ms = self.settings.batch_prefill_backlog_ms
        return float("-inf") if backlog_ms < 0 else load.batch_prefill_until - backlog_ms / 1000

    def batch_paced_until(self, candidates: list[Candidate], now: float) -> float | None:
        """When the earliest of ``candidates`` held back by batch pacing may take batch work
        again (None: pacing holds none of them back): the admission queue is pumped then."""
        times = [t for t in (self.batch_opens_at(c.load) for c in candidates) if t > now]
        return min(times) if times else None

    def prefill_over(self, ticket: Ticket) -> ReplicaLoad | None:
        """Book ``ticket``'s prefill as over on its replica, whose load it returns (None: it already
        was, or the ticket closed): its uncached tokens leave the replica's backlog and, interactive,
        it no longer keeps batch work from starting there."""
        if ticket.started or ticket.closed:
            return None
        ticket.started = True
        load = self.load(ticket.replica.id)
        load.pending_prefill_tokens -= ticket.uncached_tokens
        load.interactive_prefilling -= not ticket.batch
        return load

    def presumed_ttft_s(self, ticket: Ticket) -> float:
        """When a request whose first token this edge cannot see (a non-streamed answer arrives
        whole) is taken to be past its prefill: the TTFT the model predicted at dispatch. Without
        it, such a request would count as prefilling until its last token, holding batch work off
        its replica and inflating the replica's backlog for its whole generation."""
        return (ticket.rtt_ms + ticket.backlog_at_dispatch * self.ttft_model.prefill_ms_per_token) / 1000

    def first_byte(self, ticket: Ticket, now: float) -> None:
        """The replica streamed ``ticket``'s first token at ``now``. What it took is timed from the
        dispatch, as the prediction was: the client's TTFT also holds the wait in the edge's queue
        and any earlier try elsewhere, which say nothing about this replica (counted against it,
        a queue at the edge made whichever replica took the waiting requests look slow, and fed
        the wait into the fleet-wide prefill cost)."""
        load = self.prefill_over(ticket)
        if load is None:
            return
        rid = ticket.replica.id
        load.last_progress = now
        ttft_ms = (now - ticket.dispatched_at) * 1000
        self.ttft_model.observe(ticket.rtt_ms, ticket.backlog_at_dispatch, ttft_ms)
        if ticket.decision.predicted_ttft_ms > 0:
            previous = self.bias_ms(rid, now)
            # predicted_ttft_ms already contains the bias at dispatch; compare against the model alone
            residual = ttft_ms - (ticket.decision.predicted_ttft_ms - ticket.bias_at_dispatch)
            self.bias[rid] = (previous + self.BIAS_ALPHA * (residual - previous), now)

    def release(self, ticket: Ticket, ok: bool | None, now: float,
                reported: tuple[int, int] | None = None, completion_tokens: int | None = None) -> None:
        """``ok=None``: the request ended for reasons that say nothing about the replica (client left).
        ``reported``: (prompt tokens, cached tokens) as the engine counted them; ``completion_tokens``:
        what it generated."""
        if ticket.closed:
            return
        ticket.closed = True
        if ticket.kv_hashes is not None:
            self.pinned_kv(ticket.replica.id).unpin(ticket.kv_hashes, ticket.kv_loose_tokens)
        if completion_tokens is not None:
            vid = ticket.replica.variant_id
            typical = self.output_tokens.get(vid)
            self.output_tokens[vid] = (float(completion_tokens) if typical is None else
                                       typical + self.OUTPUT_ALPHA * (completion_tokens - typical))
        load = self.load(ticket.replica.id)
        if not ticket.started:
            load.pending_prefill_tokens -= ticket.uncached_tokens
            load.interactive_prefilling -= not ticket.batch
        load.inflight -= 1
        load.batch_inflight -= ticket.batch
        load.inflight_tokens -= ticket.reserved_tokens
        breaker = self.breaker(ticket.replica.id)
        if ok is None:
            breaker.probe_in_flight = False
        elif ok:
            breaker.on_success()
            load.last_progress = now
            # Only a prediction made while nothing else was still prefilling there can be judged: with
            # other prefills in flight the predicted blocks may simply not have been computed yet.
            settled = ticket.backlog_at_dispatch <= ticket.uncached_tokens
            if reported is not None and reported[0] > 0 and ticket.prompt_tokens > 0 and settled:
                self.index.correct(ticket.replica.id, ticket.decision.predicted_cached_tokens / ticket.prompt_tokens,
                                   reported[1] / reported[0])
        else:
            breaker.on_failure(now)

    def mark_health(self, replica_id: str, verdict: str, rtt_ms: float | None = None) -> bool:
        """Record one probe's verdict (``PROBE_*``); returns True when the replica's health flipped.
        A dead replica (could not connect) is down at once; a failing one after
        ``health_failures_to_down`` probes in a row; a slow one stays up with a scoring penalty."""
        st = self.health_of(replica_id)
        before = st.healthy
        if rtt_ms is not None:
            st.rtt_ms = rtt_ms if st.rtt_ms is None else 0.8 * st.rtt_ms + 0.2 * rtt_ms
        st.reachable = verdict != PROBE_DEAD
        st.slow_penalty_ms = self.settings.health_timeout_s * 1000 if verdict == PROBE_SLOW else 0.0
        if verdict in (PROBE_OK, PROBE_SLOW):
            st.consecutive_failures = 0
            st.healthy = True
        else:
            st.consecutive_failures += 1
            if verdict == PROBE_DEAD or st.consecutive_failures >= self.settings.health_failures_to_down:
                st.healthy = False
        return before != st.healthy
