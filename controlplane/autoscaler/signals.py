"""What the autoscaler sees (plain frozen dataclasses) and the memory it keeps between ticks.

The executor builds these from the database, the agents' heartbeats and the edges' published
signals (``controlplane.fleet.edge_signals``); the policy never reads anything else. ``AutoscalerState`` is the policy's only memory: the executor stores it
as JSON next to the pool and hands it back on the next tick, so a restarted worker carries on
where the last one stopped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

ReplicaState = Literal["starting", "ready", "draining"]
PoolKind = Literal["warm", "scale_to_zero"]


@dataclass(frozen=True)
class ReplicaSignal:
    """One engine process of the pool, with the gauges its agent last reported.

    ``node_id``, ``spot`` and ``gpus`` say where it runs; the policy does not read them (placement,
    the market and which replicas stop are the fleet's decisions)."""

    replica_id: str
    node_id: str
    state: ReplicaState
    spot: bool
    num_queue_reqs: int = 0
    num_running_reqs: int = 0
    max_running_requests: int = 1
    kv_usage: float = 0.0  # 0..1, SGLang's token_usage
    ttft_p95_s: float | None = None
    started_at: float = 0.0
    ready_at: float | None = None
    gpus: int = 1
    # A ready spare (``controlplane.fleet.spares``): it serves, so its load and capacity are the
    # pool's, but it is not one of the replicas the pool's size counts.
    spare: bool = False

    @property
    def active(self) -> bool:
        """Counts towards the pool's capacity (a draining replica is on its way out)."""
        return self.state != "draining"


@dataclass(frozen=True)
class PoolSpec:
    """Desired-state knobs an admin sets on a pool."""

    pool_id: str
    kind: PoolKind = "warm"
    min_replicas: int = 1
    max_replicas: int = 8
    ttft_slo_s: float = 2.0
    idle_timeout_s: float = 900.0
    gpus_per_replica: int = 1
    tenant_gpu_quota: int | None = None  # dedicated pools only
    # GPUs the owning tenant holds across all its pools *including this one* (draining too).
    tenant_gpus_in_use: int = 0
    # Profiled throughput one replica sustains inside the SLO, in the unit of the observation's
    # ``token_rate_history`` (weighted tokens/s, see ``weighted_tokens``), as Dynamo's planner
    # sizes from profiles. None: the policy learns it from observations.
    replica_tokens_per_s: float | None = None
    # The fleet keeps a scale-down's surplus replicas warm as spares where their GPUs stay billed
    # (``controlplane.fleet.spares``): a scale-down then gives up no warm capacity, and the policy
    # uses its warm-surplus hysteresis (``AutoscalerConfig.for_warm_surplus``).
    warm_surplus: bool = False


@dataclass(frozen=True)
class EdgeSignals:
    """What the edges see of one served model, summed over the live edges.

    The edge caps each replica at its batch slots and holds the rest in its own fair queue, so
    under exactly the bursts that need capacity the engines report no queue at all: this is the
    backlog they never see, and TTFT as clients get it (edge queueing included)."""

    edges: int = 0  # live edges that reported
    queue_depth: int = 0  # requests waiting in the edges' fair queues (at their last publish)
    activation_waiting: int = 0  # requests held while the pool starts from zero
    inflight: int = 0  # requests the edges have on the model's replicas
    queue_wait_p50_s: float | None = None  # over the window, requests that left the queue
    queue_wait_p90_s: float | None = None
    ttft_p90_s: float | None = None  # client-side: arrival at the edge to first streamed token
    ttft_samples: int = 0  # streamed first tokens behind ttft_p90_s
    # Rejections over the window by "<status>/<reason>", e.g. "503/queue_timeout", "429/tokens".
    rejections: Mapping[str, int] = field(default_factory=dict)
    window_s: float = 0.0

    @property
    def waiting(self) -> int:
        """Requests the edges hold that no replica has taken yet."""
        return self.queue_depth + self.activation_waiting

    @property
    def capacity_rejections(self) -> int:
        """Requests turned away for want of capacity (503s: queue full, queue timeout, cold start)."""
        return sum(n for reason, n in self.rejections.items() if reason.startswith("503/"))


def weighted_tokens(prompt: float, generated: float, output_token_weight: float | None) -> float:
    """Work in prompt-token equivalents: the unit of the token rate the policy sizes with.

    A prefill step takes a whole prompt, a decode step one token per request, so a generated
    token costs a replica several prompt tokens' time; how many is the variant's profile. At
    a flat request rate, a shift from long prompts to long outputs moves the plain token sum
    little while the replicas needed rise 3× (bench.autoscale's mix trace)."""
    return prompt + (1.0 if output_token_weight is None else output_token_weight) * generated


@dataclass(frozen=True)
class PoolObservation:
    now: float
    replicas: tuple[ReplicaSignal, ...] = ()
    request_rate_history: Sequence[tuple[float, float]] = ()  # (t, req/s), oldest first
    token_rate_history: Sequence[tuple[float, float]] = ()  # (t, weighted tok/s), oldest first
    model_ready_seconds: Sequence[float] = ()  # measured cold starts of this pool's model
    last_request_at: float | None = None
    activation_requested: bool = False  # the edge holds a request for a pool at zero
    edge: EdgeSignals | None = None  # the edges' view of the pool's served model; None: no edge reported


@dataclass(frozen=True)
class AutoscalerState:
    """The policy's memory between ticks; the executor persists it verbatim as JSON."""

    # (t, demand in replica units) per tick, trimmed to the longest window the policy reads.
    demand_samples: tuple[tuple[float, float], ...] = ()
    # (t, replicas' worth the reactive+predictive signals asked for) per tick, for the
    # scale-down hold.
    need_samples: tuple[tuple[float, float], ...] = ()
    # The replica count last decided; surplus replicas (a stand-in waiting for its spot
    # replacement) do not raise it, lost ones are replaced up to it.
    target: int | None = None
    panic_until: float | None = None
    panic_since: float | None = None  # when the latest panic episode began (it ends at panic_until)
    # A burst: from the first panic of an episode until the need is back near where it was
    # (``policy.track_burst``); its samples then leave the scale-down hold.
    burst_since: float | None = None
    burst_base: float | None = None  # the hold's peak need when the burst began
    burst_ended_at: float | None = None
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None
    # Learned tok/s one replica serves at the target utilization (EWMA), when not profiled.
    tokens_per_replica_s: float | None = None
    # Share of the profiled capacity a replica delivers inside the SLO, learned from TTFT.
    capacity_scale: float = 1.0
    # When the SLO feedback last cut that scale, within ``capacity_scale_breach_memory_s``:
    # repeated cuts slow its return to the profile (``policy.tune_capacity_scale``).
    capacity_cuts: tuple[float, ...] = ()
    # Previous tick's TTFT the SLO was judged on (the edges' p90, else the engines' p95), to
    # tell a draining backlog apart.
    last_slo_ttft_s: float | None = None
    last_queue_total: int | None = None  # previous tick's queued requests: is the queue draining?
    last_ready: int | None = None  # previous tick's ready replicas: did the queue have them all along?

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> AutoscalerState:
        if not text:
            return cls()
        raw = json.loads(text)
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        for key in ("demand_samples", "need_samples"):
            if key in known:
                known[key] = tuple((float(t), float(v)) for t, v in known[key])
        if "capacity_cuts" in known:
            known["capacity_cuts"] = tuple(float(t) for t in known["capacity_cuts"])
        return cls(**known)

    def evolve(self, **changes) -> AutoscalerState:
        return replace(self, **changes)
