"""The edge service: the parts an edge runs (snapshot, router, caches, limits, usage, signals)
and one inference request's way through them.

The way is a pipeline of named stages (``dataplane/edge/pipeline``):

    authenticate -> validate -> resolve -> cache (exact) -> limit -> cache (semantic)
        -> admit -> route -> relay (one retry elsewhere before the first byte) -> account

Everything it needs comes from the current snapshot (``Catalog``) and live in-process state; Redis
is used for shared limits, the usage stream and the autoscaler's signals (``signals.py``), and its
absence degrades to local behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from dataplane.edge import errors
from dataplane.edge.admission import Admission
from dataplane.edge.auth import authenticate
from dataplane.edge.breaker import OPEN, RetryBudget
from dataplane.edge.catalog import Catalog, Replica
from dataplane.edge.embedder import Embedder
from dataplane.edge.fairness import RollingPeak, ShareGuards
from dataplane.edge.health import HealthMonitor
from dataplane.edge.limits import Limiter, RedisStore
from dataplane.edge.metrics import EdgeMetrics
from dataplane.edge.pipeline import account, admit, cache
from dataplane.edge.pipeline.authenticate import authenticate_request
from dataplane.edge.pipeline.limit import apply_limits
from dataplane.edge.pipeline.record import RequestRecord
from dataplane.edge.pipeline.relay import relay
from dataplane.edge.pipeline.resolve import resolve_variant
from dataplane.edge.pipeline.validate import validate_request
from dataplane.edge.policies import TtftModel, make_policy
from dataplane.edge.prefix import PrefixIndex
from dataplane.edge.response_cache import ResponseCache, SharedResponseCache
from dataplane.edge.router import Router
from dataplane.edge.semantic_cache import SemanticCache
from dataplane.edge.settings import EdgeSettings
from dataplane.edge.signals import SignalPublisher, SignalRecorder, default_edge_id, gauges_of
from dataplane.edge.upstream import UpstreamClient
from dataplane.edge.usage import UsageRecorder
from dataplane.edge.validation import TokenEstimator
from dataplane.edge.writer import ResponseWriter, respond_json

log = logging.getLogger("nimbus.edge")


class EdgeService:
    def __init__(self, settings: EdgeSettings, source_factory: Callable[[EdgeService], Any]) -> None:
        self.settings = settings
        self.metrics = EdgeMetrics()
        self.catalog: Catalog | None = None
        self.catalog_at: float | None = None
        self.catalog_changed = asyncio.Event()  # set (and replaced) on every new snapshot
        self.estimator = TokenEstimator(settings.chars_per_token)
        self.index = PrefixIndex(settings.prefix_block_chars, settings.chars_per_token, settings.prefix_ttl_s,
                                 settings.prefix_index_blocks)
        self.ttft_model = TtftModel(settings.prefill_ms_per_token, settings.decode_ms_per_running)
        self.router = Router(settings, make_policy(settings.policy, self.index, self.ttft_model, settings.uncached_penalty,
                                         settings.balance_rel, settings.balance_abs, settings.routing_profile),
                             self.index,
                             self.ttft_model,
                             retry_budget=RetryBudget(settings.retry_budget_ratio, settings.retry_budget_min_per_s))
        self.admission = Admission(settings.queue_max, settings.queue_timeout_s, time.monotonic)
        self.extra_fields = frozenset(settings.extra_request_fields)
        # In memory until ``start`` finds Redis: then shared by the region's edges.
        self.response_cache: ResponseCache | SharedResponseCache = ResponseCache(
            settings.response_cache_entries, settings.response_cache_ttl_s, settings.response_cache_max_entry_bytes)
        self.semantic: SemanticCache | None = None  # with Redis and the embedding model (``start``)
        self.source = source_factory(self)
        self.redis = None
        self.limiter = Limiter(None, settings.limits_fail_mode, settings.local_limit_share, settings.redis_retry_s)
        self.usage: UsageRecorder | None = None
        self.upstream = UpstreamClient(buffer_bytes=settings.upstream_buffer_bytes)
        self.health: HealthMonitor | None = None
        self._background: set[asyncio.Task] = set()
        self.edge_id = settings.edge_id or default_edge_id()
        self.signals = SignalRecorder(settings.signals_window_s, settings.signals_interval_s)
        self.signal_publisher: SignalPublisher | None = None
        # What the pipeline's stages keep between requests (``pipeline/parts.py``).
        self.share_guards = ShareGuards(settings.fair_burst_slots, settings.fair_active_window_s,
                                        settings.fair_wait_share)
        # per variant: the most interactive requests one replica held lately (what batch work leaves free)
        self.interactive_peaks: dict[str, RollingPeak] = {}
        self.activation_sent: dict[str, float] = {}  # per pool: when the edge last asked for a replica

    # ------------------------------------------------------------------ lifecycle

    def on_snapshot(self, snap: dict[str, Any]) -> None:
        try:
            catalog = Catalog.from_snapshot(snap)
        except (KeyError, TypeError, ValueError) as exc:
            log.error("ignoring a malformed snapshot: %r", exc)
            return
        self.catalog = catalog
        self.catalog_at = time.monotonic()
        self._load_embedder_if_wanted()
        self.router.on_catalog(catalog)
        self.catalog_changed.set()
        self.catalog_changed = asyncio.Event()
        self.admission.pump()

    async def start(self) -> None:
        s = self.settings
        s.state_dir.mkdir(parents=True, exist_ok=True)
        if s.redis_url:
            import redis.asyncio as aioredis

            self.redis = aioredis.from_url(s.redis_url, socket_connect_timeout=0.25, socket_timeout=0.5,
                                           retry_on_timeout=False, health_check_interval=0)
            self.limiter.redis = RedisStore(self.redis, s.redis_key_prefix)
            self.response_cache = SharedResponseCache(
                self.redis, s.redis_key_prefix, s.region, max_entries=s.response_cache_entries,
                ttl_s=s.response_cache_ttl_s, max_entry_bytes=s.response_cache_max_entry_bytes,
                retry_s=s.redis_retry_s)
            if s.semantic_cache_model:
                self.semantic = SemanticCache(
                    self.redis, self.response_cache, Embedder(s.semantic_cache_model), s.redis_key_prefix, s.region,
                    max_entries=s.semantic_cache_entries, ttl_s=s.semantic_cache_ttl_s, retry_s=s.redis_retry_s)
                await self.semantic.start()
                self._load_embedder_if_wanted()
        self.usage = UsageRecorder(self.redis, s.usage_stream, s.state_dir / "usage-spool.jsonl",
                                   retry_s=s.redis_retry_s, fsync_s=s.usage_fsync_s)
        await self.usage.start()
        if self.redis is not None:
            self.signal_publisher = SignalPublisher(
                self.redis, self.signals, lambda: gauges_of(self.catalog, self.admission, self.router),
                edge_id=self.edge_id, region=s.region, prefix=s.redis_key_prefix, interval_s=s.signals_interval_s,
                on_result=lambda ok: self.metrics.child(self.metrics.signals_published, "ok" if ok else "error").inc())
            await self.signal_publisher.start()
        await self.source.start()
        self.health = HealthMonitor(self.router, lambda: self.catalog, s.health_interval_s, s.health_timeout_s,
                                    on_change=self.admission.pump, on_probe=self._on_probe)
        await self.health.start()
        self.admission.start_ticker()

    async def stop(self) -> None:
        await self.admission.stop()
        if self.health:
            await self.health.stop()
        await self.source.stop()
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await task
        if self.usage:
            await self.usage.stop()
        if self.signal_publisher:
            await self.signal_publisher.stop()
        if self.semantic:
            await self.semantic.stop()
        self.upstream.close()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()

    def _load_embedder_if_wanted(self) -> None:
        if self.semantic is not None and self.catalog is not None \
                and any(t.semantic_models for t in self.catalog.tenants.values()):
            self.semantic.wanted()

    def snapshot_age(self) -> float:
        last = getattr(self.source, "last_ok", None) or self.catalog_at
        return -1.0 if last is None else time.monotonic() - last

    def _on_probe(self, replica: Replica, ok: bool) -> None:
        self.metrics.child(self.metrics.replica_healthy, replica.id, replica.region).set(1 if ok else 0)
        self.metrics.child(self.metrics.breaker_open, replica.id).set(1 if self.router.breaker(replica.id).state == OPEN else 0)

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ GET /v1/models

    def _model_cards(self, authorization: str | None) -> dict[str, dict[str, Any]]:
        """The models this key's tenant may use, by id: ``name`` for a model's default tier,
        ``name:tier`` for the others (the names ``resolve_model`` accepts)."""
        catalog = self.current_catalog()
        tenant, key = authenticate(catalog, authorization)
        cards = {}
        for model, variant in catalog.visible_models(tenant.id):
            if not key.allows(model.name, variant.tier):
                continue
            name = model.name if variant.tier == model.default_tier else f"{model.name}:{variant.tier}"
            cards[name] = {"id": name, "object": "model", "created": 0, "owned_by": "nimbus",
                           "context_length": variant.context_length, "tier": variant.tier}
        return cards

    def list_models(self, authorization: str | None) -> bytes:
        return msgspec.json.encode({"object": "list", "data": list(self._model_cards(authorization).values())})

    def retrieve_model(self, authorization: str | None, model_id: str) -> bytes:
        """``GET /v1/models/{id}``: one card, or 404 ``model_not_found`` for a model this tenant may not
        use, exactly as if it did not exist. ``name:default-tier`` is the same model as ``name``."""
        cards = self._model_cards(authorization)
        card = cards.get(model_id)
        if card is None:
            resolved = self.current_catalog().resolve_model(model_id)
            if resolved is not None and resolved[1].tier == resolved[0].default_tier:
                card = cards.get(resolved[0].name)
        if card is None:
            raise errors.model_not_found(model_id)
        return msgspec.json.encode(card)

    def current_catalog(self) -> Catalog:
        if self.catalog is None:
            raise errors.unavailable("The edge has no snapshot yet.", 2.0, code="not_ready")
        return self.catalog

    # ------------------------------------------------------------------ inference

    async def handle_inference(self, kind: str, headers: dict[str, str], raw: bytes, writer: ResponseWriter) -> None:
        rec = RequestRecord(request_id="req_" + os.urandom(12).hex(), t0=time.monotonic(), ts=time.time())
        try:
            await self._inference(rec, kind, headers, raw, writer)
        except errors.EdgeError as exc:
            rec.status = "rejected" if exc.status < 500 else "error"
            rec.http_status = exc.status
            rec.error_code = exc.code
            if not rec.response_started:
                account.meter(self, rec)
                respond_json(writer, exc.status, exc.body(), {**rec.rate_headers, **exc.headers,
                                                             "x-request-id": rec.request_id})
        except asyncio.CancelledError:
            rec.status, rec.http_status = "client_abort", 499
            raise
        finally:
            account.finish(self, rec)

    async def _inference(self, rec: RequestRecord, kind: str, headers: dict[str, str], raw: bytes,
                         writer: ResponseWriter) -> None:
        """The stages in order; each fills the record or raises the client's error."""
        catalog = self.current_catalog()
        authenticate_request(catalog, rec, headers, self.settings.edge_token)
        body = validate_request(self, rec, kind, headers, raw)
        resolve_variant(catalog, rec, kind)
        found = await cache.look_up_exact(self, rec, kind, body) if cache.exact_wanted(rec) else cache.CacheLookup()
        assert rec.req is not None and rec.tenant is not None
        await apply_limits(self, rec, 0 if found.hit is not None else rec.req.reserved_tokens, found.state)
        if cache.semantic_wanted(self, rec, found):
            await cache.look_up_semantic(self, rec, kind, body, found)
        if found.hit is not None:
            cache.serve_hit(self, rec, kind, found.hit, found.state, writer)
            return
        fill = cache.filler(self, rec.tenant.id, found)
        if admit.is_cold(self, rec):
            await admit.activate(self, rec)
        await relay(self, rec, kind, writer, fill)
