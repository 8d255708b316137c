"""One typed settings object for every Nimbus process, read from ``NIMBUS_*`` variables.

With nothing set, Nimbus runs embedded: a SQLite file and local Celery transport under
``.nimbus/``. Production points the same code at Postgres and Redis by URL only.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from controlplane.fleet.capacity import ConsolidationBudget
from controlplane.services.signin_throttle import ThrottleSettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NIMBUS_", extra="ignore")

    state_dir: Path = Field(default=Path(".nimbus"), description="Embedded mode state: SQLite, broker files.")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db. Default: SQLite under state_dir.",
    )
    broker_url: str | None = Field(
        default=None, description="Celery broker. Default: a filesystem transport under state_dir."
    )
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", description="Limits and the usage stream.")
    usage_stream: str = Field(default="nimbus:usage", description="Redis stream the edges write usage to.")
    edge_redis_key_prefix: str = Field(
        default="nimbus:", description="The edges' Redis key prefix (their response caches live under it)."
    )
    # The semantic cache's similarity threshold: tenants choose within these bounds (bench/cache
    # measured the default: under 1% false hits on near misses with the edge's guard).
    semantic_cache_threshold_min: float = Field(default=0.80, ge=0.0, le=1.0)
    semantic_cache_threshold_max: float = Field(default=0.99, ge=0.0, le=1.0)
    semantic_cache_threshold_default: float = Field(default=0.875, ge=0.0, le=1.0)
    admin_token: SecretStr = Field(
        default=SecretStr(""), description="Bearer token of the admin API. Empty disables the admin API."
    )
    edge_token: SecretStr = Field(
        default=SecretStr(""), description="Bearer token edges use for the internal snapshot API."
    )
    session_secret: SecretStr = Field(
        default=SecretStr(""), description="Signs console session cookies; generated per state dir if empty."
    )
    public_url: str = Field(default="http://127.0.0.1:8000", description="Where agents reach the control plane.")
    edge_url: str = Field(
        default="http://127.0.0.1:8080", description="An edge proxy the console's playground streams through."
    )
    cluster_name: str = Field(default="nimbus", description="Ownership tag on every VM this cluster launches.")
    key_cache_seconds: float = Field(default=5.0, description="How long a verified API key stays cached.")
    db_pool_size: int = Field(default=10, ge=1)
    signin_throttle: ThrottleSettings = Field(
        default_factory=ThrottleSettings,
        description='Sign-in backoff and lock-out (services/signin_throttle.py), JSON, e.g. {"lock_after": 5}.',
    )
    sql_echo: bool = False
    # -- provisioning (Celery workers) ------------------------------------------------
    celery_key_prefix: str = Field(
        default="", description="Prefix for every Celery key in Redis, so deployments can share one."
    )
    aws_endpoint_url: str | None = Field(default=None, description="EC2 endpoint override (an emulator).")
    gcp_project: str | None = Field(default=None, description="GCE project to launch into.")
    gcp_endpoint_url: str | None = Field(default=None, description="Compute Engine API endpoint override.")
    local_agent_command: list[str] | None = Field(
        default=None, description="Command template for the local cloud; default: the node agent."
    )
    lease_seconds: float = Field(default=120.0, gt=0, description="How long a claimed row stays a worker's.")
    reconcile_interval_s: float = Field(default=5.0, gt=0, description="Beat: reconcile tick period.")
    autoscaler_enabled: bool = Field(
        default=True, description="Beat runs the autoscaler; off: desired_replicas is set by hand (or by tests)."
    )
    autoscale_interval_s: float = Field(default=5.0, gt=0, description="Beat: autoscaler decision period.")
    autoscaler_overrides: dict[str, float] = Field(
        default_factory=dict,
        description='JSON overrides of AutoscalerConfig knobs, e.g. {"scale_down_hold_s": 600}.',
    )
    sweep_interval_s: float = Field(default=60.0, gt=0, description="Beat: orphan/stale sweep period.")
    usage_rollup_interval_s: float = Field(default=10.0, gt=0, description="Beat: usage rollup period.")
    reconcile_batch: int = Field(default=2000, ge=1, description="Pools claimed by one reconcile tick.")
    launch_deadline_s: float = Field(default=3600.0, gt=0, description="A launch gives up (node failed) after this.")
    terminate_deadline_s: float = Field(default=1800.0, gt=0, description="Terminations retry until this.")
    retry_delay_s: float = Field(default=15.0, gt=0, description="Wait before retrying an unfinished operation.")
    drain_timeout_s: float = Field(default=300.0, ge=0, description="In-flight requests get this long to finish.")
    boot_timeout_s: float = Field(default=1200.0, gt=0, description="A booting node must heartbeat within this.")
    heartbeat_timeout_s: float = Field(default=90.0, gt=0, description="A ready node without heartbeat is stale.")
    # Static stability (controlplane/fleet/sweeper.py): silence is evidence only where most others still
    # report. Defaults after Kubernetes' node lifecycle controller (--unhealthy-zone-threshold 0.55; a
    # zone is partially disrupted only with more than 2 unready nodes; --node-eviction-rate 0.1/s).
    silent_scope_threshold: float = Field(
        default=0.55, gt=0, le=1,
        description="Share of a region's (or the fleet's) heartbeating nodes silent at once at which silence stops "
                    "being evidence there: no node in that scope is evicted for silence until they report again.",
    )
    silent_scope_min_nodes: int = Field(
        default=3, ge=1,
        description="A scope is disrupted only with at least this many silent nodes, or when all of its nodes are.",
    )
    silent_running_evict_s: float = Field(
        default=600.0, ge=0,
        description="A silent node whose VM the cloud reports running is evicted only once silent this long "
                    "(a VM the cloud reports gone or stopping goes at once).",
    )
    evictions_per_sweep: int = Field(default=2, ge=0, description="Nodes one sweep may evict for silence, fleet-wide.")
    evictions_per_minute: int = Field(
        default=6, ge=0, description="Nodes evicted for silence in any 60 s, fleet-wide (Kubernetes: 0.1 node/s)."
    )
    bootstrap_token_ttl_s: float = Field(default=1800.0, gt=0, le=3600, description="Node bootstrap token TTL.")
    bootstrap_retry_grace_s: float = Field(
        default=1800.0, gt=0, le=3600,
        description="A register retried with the same token (its answer lost) gets the same credential back for "
                    "this long after the first register, until the agent first uses the credential.",
    )
    block_zone_s: float = Field(default=600.0, gt=0, description="A capacity error avoids the zone this long.")
    block_region_s: float = Field(default=1800.0, gt=0, description="A quota error avoids the region this long.")
    block_cloud_s: float = Field(default=3600.0, gt=0, description="A config/auth error avoids the cloud this long.")
    preemption_memory_s: float = Field(
        default=1800.0, ge=0, description="Replacements avoid a zone this long after a spot preemption there."
    )
    # The GPU fleet (controlplane/fleet/reconcile.py)
    # 0: an emptied node goes at once. Its emptying was already decided after a wait: the
    # autoscaler's scale-down hold and cooldown (a replica goes only once the need has stayed
    # down), consolidation's settle time. A second wait here held billed GPUs for a reuse those
    # had already priced: at 60 s, bench/fleet's nine days cost 1.1 % more (1.208x the
    # clairvoyant bound against 1.196x) for 0.4 points of SLO attainment, which at the bound's
    # own price per point are worth less than that (bench/fleet/README.md).
    empty_node_ttl_s: float = Field(
        default=0.0, ge=0,
        description="A ready node that holds no replica (spares aside) is released after this long; 0: at once.",
    )
    replica_start_deadline_s: float = Field(
        default=1800.0, gt=0, description="A placed replica not ready by then is given up (and placed again)."
    )
    edge_signals_prefix: str = Field(
        default="nimbus:", description="Redis key prefix the edges publish their per-model signals under."
    )
    consolidation_enabled: bool = Field(default=True, description="Empty or replace underused nodes.")
    consolidation_settle_s: float = Field(
        default=ConsolidationBudget.settle_s, ge=0, description="A node must be underused this long before consolidation moves it."
    )
    # The defaults are the consolidation policy's own (one owner); bench.fleet: a half-full node never
    # moving left 13% of the sample catalog's billed GPUs idle.
    consolidation_underused_fraction: float = Field(
        default=ConsolidationBudget.underused_fraction, gt=0, le=1,
        description="A node using less than this share of its GPUs is a candidate.",
    )
    consolidation_min_score: float = Field(
        default=ConsolidationBudget.min_score, ge=0, description="Savings over an hour must be this multiple of the move's disruption cost."
    )
    consolidation_moves_per_pool: int = Field(default=ConsolidationBudget.max_moves_per_pool, ge=1, description="Moves in flight per pool.")
    consolidation_nodes_in_flight: int = Field(default=ConsolidationBudget.max_nodes_in_flight, ge=1, description="Nodes being emptied fleet-wide.")
    consolidation_max_slower_dip: float = Field(
        default=ConsolidationBudget.max_slower_dip, ge=0, le=1,
        description="Share of a pool's profiled throughput a replace onto a slower GPU type may take away until the "
                    "replicas added for it are ready (1: no cap; lower it for pools run without headroom).",
    )
    spare_replicas_enabled: bool = Field(
        default=True,
        description="Put the free GPU slots of billed nodes to work as spare replicas of the pools on the fleet "
                    "(controlplane/fleet/spares.py): they serve, are promoted on a scale-up and stop first when "
                    "placement or consolidation wants their GPUs; a scale-down keeps a replica as a spare when its "
                    "node stays billed for others.",
    )
    spare_max_ratio: float = Field(
        default=2.0, ge=0,
        description="A pool's spares stop at this multiple of its serving capacity (profiled tokens/s).",
    )
    # The Batch API (controlplane/batches): files in the region's object store, lines sent through an edge.
    batch_store_url: str | None = Field(
        default=None, description="Batch API files: s3://bucket/prefix, gs://bucket/prefix or a directory "
                                  "(default: <state_dir>/files).")
    batch_store_endpoint_url: str | None = Field(default=None, description="Object store endpoint override (an emulator).")
    batch_store_kms_key_id: str | None = Field(
        default=None, description="S3: the KMS key batch files are encrypted with (default: S3-managed keys).")
    batch_edge_url: str | None = Field(default=None, description="The edge batch workers send lines through (default: edge_url).")
    batch_file_max_bytes: int = Field(default=100 << 20, gt=0, description="Largest file a tenant may upload.")
    batch_max_requests: int = Field(default=50_000, gt=0, description="Most lines in one batch's input file (OpenAI's).")
    batch_concurrency: int = Field(default=64, ge=1, description="Lines of one batch in flight at once.")
    batch_lease_s: float = Field(default=60.0, gt=0, description="A batch worker's claim; renewed while it runs.")
    batch_interval_s: float = Field(default=2.0, gt=0, description="Beat: how often batches are picked up.")

    @property
    def resolved_batch_store_url(self) -> str:
        return self.batch_store_url or str((self.state_dir / "files").resolve())

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.state_dir / 'nimbus.db').resolve()}"

    @property
    def is_sqlite(self) -> bool:
        return self.resolved_database_url.startswith("sqlite")


@functools.cache
def get_settings() -> Settings:
    return Settings()
