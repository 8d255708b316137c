"""Edge tunables. Every field can come from the standalone config's ``settings`` block, from an
``NIMBUS_EDGE_<FIELD>`` environment variable, or from the command line (in rising precedence)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EdgeSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    region: str = "local"  # the region this edge runs in (for logs/metrics)
    control_plane_url: str | None = None
    edge_token: str = ""
    state_dir: Path = Path(".nimbus/edge")
    snapshot_poll_s: float = 2.0
    redis_url: str | None = "redis://127.0.0.1:6379/0"
    redis_key_prefix: str = "nimbus:"
    usage_stream: str = "nimbus:usage"
    redis_retry_s: float = 1.0  # after a Redis failure, go local for this long before trying again
    # Usage spool ({state_dir}/usage-spool.jsonl, see usage.py): every event is written there before the
    # response's last bytes (survives a process kill); fsynced at most this often (a machine crash loses
    # at most this much); <= 0: never fsynced.
    usage_fsync_s: float = 0.2
    # Limits when Redis is unreachable: "closed" enforces per-instance local limits (the tenant's limits
    # times local_limit_share), "open" admits everything. Neither ever fails a request with a 5xx.
    limits_fail_mode: str = "closed"
    local_limit_share: float = 1.0
    # Routing
    policy: str = "predicted_ttft"
    prefill_ms_per_token: float = 0.05  # starting value; calibrated online from observed TTFTs
    decode_ms_per_running: float = 2.0  # each running request lengthens the steps a new prefill shares
    uncached_penalty: float = 1.0  # extra weight on a prompt's own uncached prefill (see scoring.PrefixScorer)
    # predicted_ttft's scorers and their weights (scoring.py), e.g. "predicted_ttft:1,prefix:1,load:0.5";
    # empty: scoring.DEFAULT_PROFILE
    routing_profile: str = ""
    balance_rel: float = 1.5  # predicted_ttft skips replicas running > balance_rel x mean + balance_abs
    balance_abs: int = 16  # ... + this many requests: a hot tenant may fill half a replica's slots more before spilling
    default_rtt_ms: float = 1.0
    capacity_factor: float = 1.0  # fraction of a replica's max_running_requests the edge will fill
    max_inflight_per_replica: int | None = None  # hard override of the per-replica concurrency cap
    # KV-aware admission (kv.py): a request goes only where the prompt blocks and outputs of this edge's
    # requests in flight, plus its own, fit in this share of the replica's max_total_tokens; 0 disables
    kv_admission_fill: float = 1.0
    prefix_block_chars: int = 64
    prefix_index_blocks: int = 1_000_000  # global bound on the prefix index
    prefix_ttl_s: float = 600.0
    chars_per_token: float = 4.0
    # Admission
    queue_max: int = 2048
    queue_timeout_s: float = 30.0
    fair_burst_slots: float = 2.0  # per-tenant burst allowance of fairness.ShareGuard; -1 disables the guard
    fair_active_window_s: float = 10.0
    # Share of the other tenants' arrivals that may find every slot taken by a heavy tenant (and wait
    # for the next one to free): sizes the guard's reserve by queueing (ShareGuard.queueing_reserve).
    # Well under 1 %, so their p99 does not see it; the reserve grows only with its logarithm
    # (bench/edge/fairness: 0.01 put the quiet tenants' p99 at 1.54x solo, 0.001 at 1.19x).
    fair_wait_share: float = 0.001
    activation_timeout_s: float = 120.0
    # Slots of every replica that batch-class requests leave free for interactive ones: the most
    # interactive requests one replica held over the last ``interactive_peak_window_s``, plus one, and
    # never more than this share. Batch work fills what interactive traffic does not use; a burst
    # beyond the reserve preempts batch work inside engines that schedule by priority.
    interactive_reserved_share: float = 0.2
    interactive_peak_window_s: float = 60.0
    # Batch work is paced on each replica: a batch request starts only while the batch prompts
    # already sent there have at most this much predicted prefill time left (their uncached tokens
    # at the TTFT model's per-token cost, one after another). Unpaced, batch answers that finish
    # together come back as a wave of prompts that the engine prefills as one long step, and an
    # interactive request that arrives then waits for all of it (see Router.choose). 0 (the
    # default) sends one prompt per predicted prefill; a negative value turns pacing off. Measured
    # on bench/batch (bench/batch/README.md): no clear effect yet, within that bench's noise.
    batch_prefill_backlog_ms: float = 0.0
    activation_repeat_s: float = 10.0
    # Upstream
    connect_timeout_s: float = 2.0
    first_byte_timeout_s: float = 600.0
    stream_idle_timeout_s: float = 30.0
    retry_budget_ratio: float = 0.1  # retries may add at most this fraction of requests...
    retry_budget_min_per_s: float = 5.0  # ...plus this floor
    breaker_failures: int = 5
    breaker_cooldown_s: float = 10.0
    health_interval_s: float = 5.0
    health_timeout_s: float = 5.0
    health_failures_to_down: int = 2
    # A probe that times out while the replica still carries this edge's traffic fails it only once
    # that traffic has shown no progress (no first byte, chunk or finished answer) for this long: a
    # busy engine is slow, a hung one is stuck. Matches the stream idle timeout by default.
    health_stall_s: float = 30.0
    region_fail_fraction: float = 0.5
    # /health/ready and /health/models/{model} (readiness.py) fail once the control plane's snapshot is
    # older than this (the edge still serves from it); 0: never. Generous on purpose: the edges of every
    # region share one control plane, and its outage must not pull them all out of DNS at once.
    health_snapshot_max_age_s: float = 300.0
    # Validation
    max_body_bytes: int = 4 * 1024 * 1024
    # A Batch API file upload (/v1/files, forwarded to the control plane, which checks its own limit),
    # and the whole-body deadline it gets instead of ``body_timeout_s`` (101 MiB at ~3 Mbit/s).
    max_file_upload_bytes: int = 101 * 1024 * 1024
    file_upload_timeout_s: float = 300.0
    max_json_depth: int = 64  # deeper JSON bodies get a 400 (a JSON schema in `tools` is rarely past 10)
    max_messages: int = 2048
    max_n: int = 8
    # Request fields allowed beyond OpenAI's and SGLang's documented ones (validation.KNOWN_FIELDS),
    # forwarded to the engine as they are: e.g. an extra that a newer SGLang release added.
    extra_request_fields: tuple[str, ...] = ()
    # The HTTP server against hostile clients (dataplane/httpserver.py; nginx's names in brackets).
    # A new connection's first request head, and any head once begun, within this [client_header_timeout].
    header_timeout_s: float = 10.0
    # A request's whole body within this after its head; a whole-body deadline, so a byte a second
    # cannot hold a connection [client_body_timeout, which is between reads]. 4 MiB at ~1 Mbit/s.
    body_timeout_s: float = 30.0
    keep_alive_s: float = 75.0  # idle keep-alive connection [keepalive_timeout]; above the LBs' 60 s
    # A client that reads none of its stream for this long is disconnected and its engine request
    # aborted [send_timeout].
    send_timeout_s: float = 60.0
    max_header_bytes: int = 32 * 1024  # request line + headers [large_client_header_buffers 4 x 8k]: 431
    max_headers: int = 100  # header fields per request: 431
    # Client connections [limit_conn]; 0: derived from the open-file limit (raised to its hard limit at
    # start), (RLIMIT_NOFILE - 256) // 2, since every client connection in flight also holds one to an
    # engine. Past it a new connection gets 503 with Retry-After.
    max_connections: int = 0
    # Per client address; 0: a quarter of max_connections (a tenant behind one NAT address may run
    # hundreds of streams; one address can never take all). Behind an L4 balancer that does not keep
    # the client's address this is per balancer node: set it explicitly there.
    max_connections_per_client: int = 0
    # Unauthenticated requests (401) per client address: a token bucket of this rate and burst; past
    # it such requests get 429 and their connection is closed.
    unauth_rate_per_s: float = 5.0
    unauth_burst: int = 20
    # Engine-side back-pressure: a stream's body buffered in the edge beyond this pauses reading
    # from the engine's connection until the client catches up.
    upstream_buffer_bytes: int = 256 * 1024
    # Response cache
    response_cache_entries: int = 10_000
    response_cache_ttl_s: float = 600.0
    response_cache_max_entry_bytes: int = 1 << 20  # a larger answer is not cached
    # Semantic cache (semantic_cache.py): needs Redis and the ``semantic`` extra; "" turns it off.
    semantic_cache_model: str = "all-MiniLM-L6-v2"
    # Per region: the log stream and every edge's index (the answers count in response_cache_entries).
    semantic_cache_entries: int = 10_000
    semantic_cache_ttl_s: float = 600.0
    # Signals for the autoscaler (signals.py), published to Redis every interval over the window
    edge_id: str = ""  # empty: hostname-pid-random
    signals_interval_s: float = 5.0
    signals_window_s: float = 30.0

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def merged(self, overrides: dict[str, Any]) -> EdgeSettings:
        """Apply overrides (strings from env/CLI are coerced to the field's type)."""
        types = {f.name: f.type for f in fields(self)}
        clean: dict[str, Any] = {}
        for name, value in overrides.items():
            if name not in types or value is None:
                continue
            clean[name] = _coerce(getattr(self, name), types[name], value)
        return replace(self, **clean)

    def with_env(self, environ: dict[str, str] | None = None) -> EdgeSettings:
        environ = os.environ if environ is None else environ
        found = {}
        for name in self.field_names():
            key = f"NIMBUS_EDGE_{name.upper()}"
            if key in environ:
                found[name] = environ[key]
        if "NIMBUS_CONTROL_PLANE_URL" in environ and "control_plane_url" not in found:
            found["control_plane_url"] = environ["NIMBUS_CONTROL_PLANE_URL"]
        return self.merged(found)


def _coerce(current: Any, annotation: Any, value: Any) -> Any:
    if not isinstance(value, str):
        if isinstance(current, tuple):
            return tuple(value)
        return Path(value) if isinstance(current, Path) else value
    text = str(annotation)
    if isinstance(current, tuple):  # a comma-separated list from the environment
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(current, bool) or text == "bool":
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(current, Path) or "Path" in text:
        return Path(value)
    if value.lower() in ("none", "null", ""):
        return None if "None" in text else value
    if isinstance(current, int) or text.startswith("int"):
        return int(value)
    if isinstance(current, float) or text.startswith("float"):
        return float(value)
    return value
