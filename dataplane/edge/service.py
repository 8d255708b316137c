"""The edge service: one request's path from bearer key to the last streamed byte.

auth -> validate -> (response cache) -> limits -> (activation) -> fair admission + routing
-> forward (one retry elsewhere before the first byte) -> stream -> reconcile limits, meter usage.

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
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dataplane.edge import errors
from dataplane.edge.admission import Admission
from dataplane.edge.auth import authenticate, batch_caller
from dataplane.edge.breaker import OPEN, RetryBudget
from dataplane.edge.catalog import BATCH, INTERACTIVE, ApiKey, Catalog, Replica, Tenant, Variant
from dataplane.edge.echo import echo, model_rewrite
from dataplane.edge.embedder import Embedder
from dataplane.edge.fairness import RollingPeak, ShareGuard, Waiter
from dataplane.edge.health import HealthMonitor
from dataplane.edge.limits import Lease, Limiter, RedisStore, to_error
from dataplane.edge.metrics import EdgeMetrics
from dataplane.edge.policies import RouteRequest, TtftModel, make_policy
from dataplane.edge.prefix import PrefixIndex, block_hashes
from dataplane.edge.response_cache import BYPASS, HIT, MISS, ResponseCache, SharedResponseCache, cache_key
from dataplane.edge.router import Router, Ticket
from dataplane.edge.semantic_cache import SEMANTIC, SemanticCache, semantic_scope
from dataplane.edge.settings import EdgeSettings
from dataplane.edge.signals import (
    SignalPublisher,
    SignalRecorder,
    default_edge_id,
    gauges_of,
    rejection_reason,
)
from dataplane.edge.sse import (
    DONE,
    SseSplitter,
    assemble,
    carries_output,
    error_event,
    is_error_event,
    replay,
    token_counts,
    usage_of_event,
)
from dataplane.edge.upstream import ConnectFailed, UpstreamClient, UpstreamError, UpstreamResponse
from dataplane.edge.usage import UsageRecorder, make_event
from dataplane.edge.validation import (
    CHAT,
    EMBEDDING,
    KIND_PATHS,
    InferenceRequest,
    TokenEstimator,
    check_context,
    parse_json,
    upstream_body,
    validate,
)

log = logging.getLogger("nimbus.edge")

Send = Callable[[dict[str, Any]], Awaitable[None]]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
JSON_HEADERS = [(b"content-type", b"application/json")]

# Outcomes of one forwarding attempt (or a ``Failure``).
DONE_OK, DONE_ERROR = "ok", "error"
# Engine statuses that say "not now" about the replica, never "this request is bad".
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


@dataclass(slots=True)
class Failure:
    """One attempt that failed before the client saw a byte.

    ``charged``: already counted against the replica's breaker (it could not be reached, or did
    not answer in time: nothing the request's content did). Any other failure (an engine 5xx, a
    reset or broken body after the request went out) might be the request's own doing; it is
    counted only once another replica served the same request, and not at all if another replica
    fails the same way (then the request is at fault, and the client is told so)."""

    replica_id: str
    kind: str  # "connect" | "timeout" | "http" | "broke"
    status: int = 0
    detail: bytes = b""
    charged: bool = False

    def same_as(self, other: Failure) -> bool:
        return not self.charged and not other.charged and (self.kind, self.status) == (other.kind, other.status)


@dataclass(slots=True)
class RequestState:
    request_id: str
    t0: float
    ts: float
    tenant: Tenant | None = None
    key: ApiKey | None = None
    variant: Variant | None = None
    model: str = ""
    priority: str = INTERACTIVE
    req: InferenceRequest | None = None
    lease: Lease | None = None
    ticket: Ticket | None = None
    rate_headers: dict[str, str] = field(default_factory=dict)
    response_started: bool = False
    queue_ms: float | None = None
    ttft_ms: float | None = None
    status: str = "error"
    http_status: int = 500
    usage: dict[str, Any] | None = None
    chunks: int = 0
    replica: Replica | None = None
    error_code: str | None = None
    metered: bool = False  # its usage event is in the spool (written before the response's last bytes)
    echo: tuple[bytes, bytes] | None = None  # served -> requested model name in the answer (echo.py)
    batch_line: bool = False  # sent by the batch runner, under the line's own request id
    cache: str | None = None  # "hit" / "semantic" when answered from a cache (metered as a cached response)


def _headers(pairs: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in pairs.items()]


def _plain_events(chunk: bytes, splitter: SseSplitter) -> bool:
    """True when the chunk is whole SSE events that carry neither usage nor an error, so it can be
    forwarded without being cut into events."""
    return (not splitter.pending and chunk.endswith(b"\n\n") and b'"usage":{' not in chunk
            and b'"usage": {' not in chunk and b'"error"' not in chunk)


def _ends_stream(chunk: bytes) -> bool:
    """A chunk of whole events that carries ``[DONE]`` (always the last event of a stream)."""
    return chunk.startswith(b"data: [DONE]") or chunk.endswith(b"data: [DONE]\n\n")


def _reported(usage: dict[str, Any] | None) -> tuple[int, int] | None:
    """(prompt, cached) tokens as the engine counted them, for the prefix index's self-correction."""
    if not usage:
        return None
    prompt, _, cached = token_counts(usage)
    return prompt, cached


def _engine_message(data: bytes) -> str:
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        obj = None
    message = None
    if isinstance(obj, dict):
        inner = obj.get("error") if isinstance(obj.get("error"), dict) else obj
        message = inner.get("message") or inner.get("detail")
    if not isinstance(message, str) or not message:
        message = data[:500].decode("utf-8", "replace").strip() or "The model engine refused the request."
    return message[:2000]


def engine_client_error(status: int, data: bytes) -> errors.EdgeError:
    """An engine's 4xx as the client gets it: OpenAI's error shape; 413 and 422 kept, 429 as a rate
    limit, any other 4xx a 400."""
    message = _engine_message(data)
    if status == 429:
        return errors.EdgeError(429, message, type="rate_limit_error", code="engine_overloaded",
                                headers={"retry-after": "1"})
    return errors.EdgeError(status if status in (413, 422) else 400, message, code="engine_rejected_request")


def engine_stream_refusal(event: bytes) -> errors.EdgeError | None:
    """An engine's error event before any output, as a 4xx, if it says it is one."""
    try:
        obj = msgspec.json.decode(event[event.index(b"{"):])
    except (ValueError, msgspec.DecodeError, RecursionError):
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict):
        return None
    code = err.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else 0
    if 400 <= status < 500:
        return engine_client_error(status, msgspec.json.encode(obj))
    return None


async def send_json(send: Send, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
    headers = JSON_HEADERS + _headers(extra or {})
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class EdgeService:
    def __init__(self, settings: EdgeSettings, source_factory: Callable[[EdgeService], Any]) -> None:
        self.settings = settings
        self.metrics = EdgeMetrics()
        self.catalog: Catalog | None = None
        self.catalog_at: float | None = None
        self._catalog_changed = asyncio.Event()
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
        self.share_guards: dict[str, ShareGuard] = {}  # per variant
        # per variant: the most interactive requests one replica held lately (what batch work leaves free)
        self.interactive_peaks: dict[str, RollingPeak] = {}
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
        self._activation_sent: dict[str, float] = {}
        self._background: set[asyncio.Task] = set()
        self.edge_id = settings.edge_id or default_edge_id()
        self.signals = SignalRecorder(settings.signals_window_s, settings.signals_interval_s)
        self.signal_publisher: SignalPublisher | None = None

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
        self._catalog_changed.set()
        self._catalog_changed = asyncio.Event()
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

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ GET /v1/models

    def _model_cards(self, authorization: str | None) -> dict[str, dict[str, Any]]:
        """The models this key's tenant may use, by id: ``name`` for a model's default tier,
        ``name:tier`` for the others (the names ``resolve_model`` accepts)."""
        catalog = self._catalog()
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
            resolved = self._catalog().resolve_model(model_id)
            if resolved is not None and resolved[1].tier == resolved[0].default_tier:
                card = cards.get(resolved[0].name)
        if card is None:
            raise errors.model_not_found(model_id)
        return msgspec.json.encode(card)

    def _catalog(self) -> Catalog:
        if self.catalog is None:
            raise errors.unavailable("The edge has no snapshot yet.", 2.0, code="not_ready")
        return self.catalog

    # ------------------------------------------------------------------ inference

    async def handle_inference(self, kind: str, headers: dict[str, str], raw: bytes, send: Send) -> None:
        st = RequestState(request_id="req_" + os.urandom(12).hex(), t0=time.monotonic(), ts=time.time())
        try:
            await self._inference(st, kind, headers, raw, send)
        except errors.EdgeError as exc:
            st.status = "rejected" if exc.status < 500 else "error"
            st.http_status = exc.status
            st.error_code = exc.code
            if not st.response_started:
                self._meter(st)
                hdrs = {**st.rate_headers, **exc.headers, "x-request-id": st.request_id}
                await send_json(send, exc.status, exc.body(), hdrs)
        except asyncio.CancelledError:
            st.status, st.http_status = "client_abort", 499
            raise
        finally:
            self._finish(st)

    async def _inference(self, st: RequestState, kind: str, headers: dict[str, str], raw: bytes,
                         send: Send) -> None:
        s = self.settings
        catalog = self._catalog()
        batch = batch_caller(catalog, headers, s.edge_token)
        if batch is not None:  # a line of a tenant's batch, sent by the control plane's batch runner
            tenant, key, st.request_id = batch
            st.batch_line = True
        else:
            tenant, key = authenticate(catalog, headers.get("authorization"))
        st.tenant, st.key = tenant, key
        body = parse_json(raw, s.max_body_bytes, s.max_json_depth)
        req = validate(kind, body, self.estimator, max_messages=s.max_messages, max_n=s.max_n,
                       extra_fields=self.extra_fields)
        st.req, st.model = req, req.model
        st.priority = BATCH if batch is not None else self._priority(key, req, headers)
        resolved = catalog.resolve_model(req.model)
        if resolved is None or not catalog.usable_pools(tenant.id, resolved[1].id) \
                or not key.allows(resolved[0].name, resolved[1].tier):
            raise errors.model_not_found(req.model)
        variant = resolved[1]
        if (kind == EMBEDDING) != (variant.task == "embed"):
            raise errors.bad_request(
                f"The model '{req.model}' {'does not serve embeddings' if kind == EMBEDDING else 'is an embedding model'}"
                f"; use {'/v1/chat/completions or /v1/completions' if kind == EMBEDDING else '/v1/embeddings'}.",
                param="model", code="model_not_supported")
        st.variant = variant
        st.echo = model_rewrite(variant.served_model_name, req.model)
        check_context(req, variant.context_length)

        # The exact cache: what every answer says about it (x-nimbus-cache), and a hit served as the
        # client asked for it, streamed (replayed) or not. A miss fills it with its answer, streamed
        # or not (a stream as the whole answer it adds up to, ``sse.assemble``); with the shared
        # store unreachable the answer is "bypass" and the request goes to the engines.
        ckey, hit, cache_state = None, None, BYPASS
        if tenant.response_cache and req.deterministic:
            ckey = cache_key(tenant.id, variant.id, kind, body)
            cache_state, hit = await self.response_cache.lookup(ckey, tenant.id)
            if cache_state != MISS:
                ckey = None

        # A hit costs no GPU tokens but is a request: it counts against RPM (and concurrency).
        decision = await self.limiter.admit(tenant, st.request_id, 0 if hit is not None else req.reserved_tokens)
        if self.limiter.redis is not None and not self.limiter.redis_usable and not tenant.limits.unlimited:
            self.metrics.limits_fallback.inc()
        st.rate_headers = {**decision.headers, "x-nimbus-cache": cache_state}
        if not decision.allowed:
            self.metrics.child(self.metrics.rate_limited, decision.reason).inc()
            raise to_error(decision)
        st.lease = decision.lease

        # Then the semantic cache, for tenants that opted in for this model: the same question in
        # other words, in the same scope (system prompt, history, sampling parameters). After the
        # limits, so a request they refuse costs no embedding; a hit's reserved tokens are given
        # back when it is settled (it used none).
        semantic_fill = None
        if hit is None and self.semantic is not None and req.deterministic and tenant.semantic_for(req.model):
            scoped = semantic_scope(tenant.id, variant.id, kind, body)
            if scoped is not None:
                found = await self.semantic.lookup(tenant.id, *scoped, tenant.semantic_threshold)
                if found.state == HIT:
                    hit, cache_state = found.body, SEMANTIC
                    self.metrics.child(self.metrics.semantic_scores, req.model).observe(found.score)
                elif found.state == MISS:
                    cache_state = MISS
                    semantic_fill = (*scoped, found.vector)
                st.rate_headers["x-nimbus-cache"] = cache_state

        if hit is not None:
            self.metrics.child(self.metrics.cache_hits, req.model).inc()
            st.status, st.http_status, st.cache = "ok", 200, cache_state
            st.response_started = True
            self._meter(st)
            extra = {**st.rate_headers, "x-request-id": st.request_id}
            if req.stream:
                await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + _headers(extra)})
                await send({"type": "http.response.body", "body": replay(hit, kind == CHAT, req.include_usage),
                            "more_body": False})
            else:
                await send_json(send, 200, hit, extra)
            return

        fill = self._cache_filler(tenant.id, ckey, semantic_fill)

        if not catalog.candidates(tenant.id, variant.id):
            self.signals.holding(variant.served_model_name, 1)  # backlog for the autoscaler
            try:
                await self._activate(tenant, variant, req.model)
            finally:
                self.signals.holding(variant.served_model_name, -1)

        route_req = RouteRequest(block_hashes(req.prompt_text, s.prefix_block_chars), req.prompt_tokens_est,
                                 len(req.prompt_text), tenant.id, req.max_tokens)
        payload = upstream_body(req, variant.served_model_name, st.priority, variant.priority_scheduling)
        path = KIND_PATHS[kind]
        excluded: set[str] = set()
        self.router.retry_budget.on_request(time.monotonic())
        first: Failure | None = None
        for _attempt in (0, 1):
            ticket = await self._acquire(st, route_req, excluded)
            outcome = await self._forward(st, ticket, path, payload, send, fill)
            if not isinstance(outcome, Failure):
                if first is not None:  # another replica served it: the first one's failure was its own
                    self._charge(first)
                return
            if first is not None:
                raise self._judge(st, first, outcome)
            first = outcome
            excluded.add(ticket.replica.id)
            if not self._another_replica(st, excluded):
                # Nobody to tell a bad replica from a bad request: answer now, blame nobody.
                raise self._unverified(first)
            if not self.router.retry_budget.try_spend(time.monotonic()):
                self.metrics.child(self.metrics.retry_denied, req.model).inc()
                raise self._unverified(first)
            self.metrics.child(self.metrics.retries, req.model, "before_first_byte").inc()
        raise errors.upstream_failed()  # not reached: the second attempt returns or raises

    def _charge(self, failure: Failure) -> None:
        if not failure.charged:
            failure.charged = True
            breaker = self.router.breaker(failure.replica_id)
            breaker.on_failure(time.monotonic())
            self.metrics.child(self.metrics.breaker_open, failure.replica_id).set(1 if breaker.state == OPEN else 0)

    def _another_replica(self, st: RequestState, excluded: set[str]) -> bool:
        catalog = self.catalog
        if catalog is None or st.tenant is None or st.variant is None:
            return False
        replicas = catalog.candidates(st.tenant.id, st.variant.id)
        return bool(self.router.eligible(catalog, replicas, time.monotonic(), excluded))

    def _judge(self, st: RequestState, first: Failure, second: Failure) -> errors.EdgeError:
        """Two replicas failed the same request before the first byte."""
        assert st.req is not None
        if first.same_as(second):
            # The same failure on a second replica: the request did it. No breaker hears of it, and
            # it is not tried a third time.
            if second.kind == "http" and second.status in UNAVAILABLE_STATUSES:
                self.metrics.child(self.metrics.poison, st.req.model, "unavailable").inc()
                return errors.unavailable("The model's replicas are not taking requests right now.", 2.0,
                                          code="engine_unavailable")
            self.metrics.child(self.metrics.poison, st.req.model, f"{second.kind}_{second.status}").inc()
            log.info("request %s failed the same way on replicas %s and %s (%s %s): the request's fault",
                     st.request_id, first.replica_id, second.replica_id, second.kind, second.status)
            return errors.EdgeError(
                422, "The model engine failed on this request on two replicas; it cannot be processed as sent. "
                     "Check its parameters.", code="engine_rejected_request")
        if not first.charged and not second.charged:  # two different failures: each replica's own
            self._charge(first)
            self._charge(second)
        # Else one replica was unreachable (charged already), which says nothing about the other's failure.
        return errors.upstream_failed()

    def _unverified(self, failure: Failure) -> errors.EdgeError:
        if failure.kind == "http" and failure.status in UNAVAILABLE_STATUSES:
            return errors.unavailable("The model replica is not taking requests right now.", 2.0,
                                      code="engine_unavailable")
        return errors.upstream_failed()

    @staticmethod
    def _priority(key: ApiKey, req: InferenceRequest, headers: dict[str, str]) -> str:
        """Per request (body ``priority`` or ``x-nimbus-priority``) or else per key; a batch key
        cannot promote itself to interactive."""
        asked = req.priority or headers.get("x-nimbus-priority")
        if key.priority == BATCH:
            return BATCH
        return asked if asked in (INTERACTIVE, BATCH) else key.priority

    async def _activate(self, tenant: Tenant, variant: Variant, model: str) -> None:
        """Scale from zero: ask the control plane for replicas and hold the request until the snapshot
        shows one ready, or the bound passes."""
        s = self.settings
        deadline = time.monotonic() + s.activation_timeout_s
        while True:
            catalog = self._catalog()
            if catalog.candidates(tenant.id, variant.id):
                return
            now = time.monotonic()
            if now >= deadline:
                raise errors.unavailable(f"The model `{model}` is starting; retry shortly.", 10.0,
                                         code="model_cold_start")
            for pool in catalog.usable_pools(tenant.id, variant.id):
                if now - self._activation_sent.get(pool.id, -1e9) >= s.activation_repeat_s:
                    self._activation_sent[pool.id] = now
                    self.metrics.child(self.metrics.activations, model).inc()
                    self._spawn(self.source.activate(pool.id, variant.id))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._catalog_changed.wait(), min(deadline - now, s.activation_repeat_s))

    def share_guard(self, variant_id: str) -> ShareGuard:
        guard = self.share_guards.get(variant_id)
        if guard is None:
            guard = self.share_guards[variant_id] = ShareGuard(self.settings.fair_burst_slots,
                                                               self.settings.fair_active_window_s,
                                                               wait_share=self.settings.fair_wait_share)
        return guard

    async def _acquire(self, st: RequestState, route_req: RouteRequest, excluded: set[str]) -> Ticket:
        tenant, variant, req = st.tenant, st.variant, st.req
        assert tenant is not None and variant is not None and req is not None
        queue = self.admission.queue(variant.id)
        # The fair-share guard keeps interactive tenants from crowding each other out. Batch-class
        # work is not its business: it already yields to every interactive tenant (the reserve
        # below, and preemption inside engines that schedule by priority), so holding it back for
        # them as well left a fifth of the fleet's spare capacity idle (bench/batch: 0.67 of the
        # spare tokens used with the guard, 0.79 without, interactive p99 1.12x either way).
        guarded = st.priority != BATCH
        guard = self.share_guard(variant.id)
        if guarded:
            guard.seen(tenant.id, time.monotonic())
        # Batch work leaves a share of every replica's slots to interactive traffic.
        keep_free = self.settings.interactive_reserved_share if st.priority == BATCH else 0.0
        # ...and where the engines preempt by priority, interactive work may take the slots batch work holds.
        preempts = st.priority == INTERACTIVE and variant.priority_scheduling is not None

        def try_dispatch(now: float) -> Ticket | None:
            catalog = self.catalog
            if catalog is None:
                return None
            replicas = catalog.candidates(tenant.id, variant.id)
            candidates = self.router.eligible(catalog, replicas, now, excluded)
            free = sum(max(0, c.capacity - c.running + (c.load.batch_inflight if preempts else 0)) for c in candidates)
            if guarded and not guard.allows(tenant.id, free, sum(c.capacity for c in candidates), now):
                return None
            peak = self.interactive_peaks.get(variant.id)
            decision = self.router.choose(route_req, candidates, now, keep_free=keep_free, preempts_batch=preempts,
                                          interactive_peak=peak.recent(now) if peak is not None else 0.0)
            if decision is None:
                if st.priority == BATCH:
                    # Held back by pacing: try again when it ends, not only when something finishes.
                    until = self.router.batch_paced_until(candidates, now)
                    if until is not None:
                        self.admission.pump_at(variant.id, until - now)
                return None
            ticket = self.router.dispatch(catalog, decision, route_req, req.reserved_tokens, now,
                                          batch=st.priority == BATCH)
            if not req.stream:  # its first byte is its last: its prefill is presumed over in time
                asyncio.get_running_loop().call_later(self.router.presumed_ttft_s(ticket), self._prefill_presumed_over,
                                                      ticket)
            if st.priority != BATCH:
                load = self.router.load(ticket.replica.id)
                if peak is None:
                    peak = self.interactive_peaks[variant.id] = RollingPeak(self.settings.interactive_peak_window_s, now)
                peak.observe(load.inflight - load.batch_inflight, now)
            ticket.tenant_id = tenant.id
            if candidates[0].degraded:  # every candidate of one answer shares its tier
                self.metrics.child(self.metrics.degraded_dispatches, req.model, candidates[0].degraded).inc()
            if guarded:
                guard.acquired(tenant.id, now)
            self.metrics.child(self.metrics.inflight, ticket.replica.id).set(self.router.load(ticket.replica.id).inflight)
            st.ticket = ticket
            queue.charge_admit(tenant.id, tenant.weight, route_req.prompt_tokens)
            rid = ticket.replica.id
            self.metrics.child(self.metrics.routed, req.model, rid, decision.policy).inc()
            self.metrics.child(self.metrics.est_prefix_hit_tokens, req.model, rid).inc(decision.predicted_cached_tokens)
            return ticket

        waiter = Waiter(tenant.id, tenant.weight, st.priority, route_req.prompt_tokens, time.monotonic(),
                        try_dispatch)
        t_wait = time.monotonic()
        try:
            ticket = await self.admission.admit(variant.id, waiter)
        finally:  # dispatched, timed out or given up: it waited this long either way
            waited = time.monotonic() - t_wait
            self.signals.queue_wait(variant.served_model_name, waited)
        st.queue_ms = (st.queue_ms or 0.0) + waited * 1000
        self.metrics.child(self.metrics.queue_time, req.model, st.priority).observe(waited)
        self.metrics.queue_depth.set(self.admission.queued())
        st.replica = ticket.replica
        return ticket

    def _prefill_presumed_over(self, ticket: Ticket) -> None:
        # Batch work held off the replica by this interactive request's prefill may start now.
        if self.router.prefill_over(ticket) is not None and not ticket.batch:
            self.admission.pump(ticket.replica.variant_id)

    def _release(self, st: RequestState, ticket: Ticket, ok: bool | None,
                 reported: tuple[int, int] | None = None) -> None:
        if not ticket.closed and not ticket.batch:  # batch work never took a place in the guard
            self.share_guard(ticket.replica.variant_id).released(ticket.tenant_id, time.monotonic())
        rid = ticket.replica.id
        breaker = self.router.breakers.get(rid)
        before = breaker.state if breaker is not None else None
        completion = token_counts(st.usage)[1] if ok and st.usage else None
        self.router.release(ticket, ok, time.monotonic(), reported, completion)
        if breaker is not None and breaker.state != before:
            self.metrics.child(self.metrics.breaker_open, rid).set(1 if breaker.state == OPEN else 0)
        self.metrics.child(self.metrics.inflight, rid).set(self.router.load(rid).inflight)
        self.admission.pump(ticket.replica.variant_id)

    def _cache_filler(self, tenant_id: str, ckey: str | None,
                      semantic_fill: tuple | None) -> Callable[[bytes], None] | None:
        """What stores a miss's answer (off the answer's path), or None when no cache wants it."""
        if ckey is None and semantic_fill is None:
            return None

        def fill(data: bytes) -> None:
            if ckey is not None:
                self._spawn(self.response_cache.store(ckey, data, tenant_id))
            if semantic_fill is not None and self.semantic is not None:
                self._spawn(self.semantic.store(tenant_id, *semantic_fill, data))
        return fill

    async def _forward(self, st: RequestState, ticket: Ticket, path: str, payload: bytes, send: Send,
                       fill: Callable[[bytes], None] | None) -> str | Failure:
        assert st.req is not None
        req = st.req
        rid = ticket.replica.id
        s = self.settings
        try:
            resp = await self.upstream.post(
                ticket.replica.url, path, payload,
                {"Content-Type": "application/json", "X-Request-Id": st.request_id},
                connect_timeout=s.connect_timeout_s,
                first_byte_timeout=s.stream_idle_timeout_s if req.stream else s.first_byte_timeout_s)
        except (ConnectFailed, TimeoutError) as exc:
            # Not reached, or no answer in time: the replica's, whatever the request holds.
            log.info("replica %s failed before answering: %r", rid, exc)
            self.metrics.child(self.metrics.errors, req.model, rid, "connect").inc()
            self._release(st, ticket, False)
            return Failure(rid, "timeout" if isinstance(exc, TimeoutError) else "connect", charged=True)
        except (UpstreamError, OSError) as exc:
            log.info("replica %s broke the connection before answering: %r", rid, exc)
            self.metrics.child(self.metrics.errors, req.model, rid, "reset").inc()
            self._release(st, ticket, None)
            return Failure(rid, "broke")
        try:
            if resp.status >= 500:
                self.metrics.child(self.metrics.errors, req.model, rid, f"http_{resp.status}").inc()
                self._release(st, ticket, None)  # judged once another replica has had the request
                return Failure(rid, "http", resp.status)
            if resp.status != 200:
                # The engine refused the request itself (a 4xx): not the replica's fault, not retried.
                data = b""
                with contextlib.suppress(UpstreamError, TimeoutError, OSError):
                    data = await resp.read(min(s.first_byte_timeout_s, 10.0))
                self._release(st, ticket, None)
                raise engine_client_error(resp.status, data)
            if req.stream:
                return await self._stream(st, ticket, resp, send, fill)
            try:
                data = await resp.read(s.first_byte_timeout_s)
            except (UpstreamError, TimeoutError, OSError) as exc:
                log.info("replica %s failed while answering: %r", rid, exc)
                self.metrics.child(self.metrics.errors, req.model, rid, "read").inc()
                self._release(st, ticket, None)
                return Failure(rid, "broke")
            st.ttft_ms = (time.monotonic() - st.t0) * 1000
            data = echo(data, st.echo)
            try:
                st.usage = msgspec.json.decode(data).get("usage")
            except (msgspec.DecodeError, AttributeError):
                st.usage = None
            self._release(st, ticket, True, _reported(st.usage))
            st.status, st.http_status, st.response_started = "ok", 200, True
            if fill is not None:
                fill(data)
            self._meter(st)
            await send_json(send, 200, data, {**st.rate_headers, "x-request-id": st.request_id})
            return DONE_OK
        finally:
            if resp.pauses:
                self.metrics.upstream_paused.inc(resp.pauses)
            resp.close()  # also aborts the engine's work when we leave early (client gone)

    async def _stream(self, st: RequestState, ticket: Ticket, resp: UpstreamResponse, send: Send,
                      fill: Callable[[bytes], None] | None = None) -> str | Failure:
        assert st.req is not None
        req = st.req
        # A stream that fills a response cache is kept as it goes out, to be added up into the
        # whole answer at its end (``sse.assemble``); it forgoes the socket fast path for that.
        sent: list[bytes] | None = [] if fill is not None else None
        labels = (req.model, ticket.replica.id, st.priority)
        itl_hist = self.metrics.child(self.metrics.itl, *labels)
        splitter = SseSplitter()
        saw_done = False
        upstream_error = False
        failure: BaseException | None = None
        held: list[bytes] = []  # the role-only opening chunk, held until the first token exists
        last = 0.0
        write_now = getattr(send, "write_now", None)
        load = self.router.load(ticket.replica.id)

        def count_tokens(chunk: bytes) -> None:
            """Bookkeeping for a chunk of whole token events forwarded as is."""
            nonlocal last
            st.chunks += chunk.count(b"\n\n")
            now = time.monotonic()
            itl_hist.observe(now - last)
            last = load.last_progress = now

        def forward_now(chunk: bytes) -> bool:
            """The upstream parser's sink once the response has started: whole plain token events
            go straight to the client's socket, without waking this task. Everything else ([DONE],
            usage, errors, partial events, a backed-up client) is refused and read below."""
            if not _plain_events(chunk, splitter) or _ends_stream(chunk):
                return False
            if st.echo is not None:
                chunk = echo(chunk, st.echo)
            if not write_now(chunk):
                return False
            count_tokens(chunk)
            return True

        try:
            async for chunk in resp.iter_chunks(self.settings.stream_idle_timeout_s):
                if st.response_started and _plain_events(chunk, splitter):
                    # Whole events, no usage, no error: forward as is. With the sink installed only
                    # a backed-up client or the stream's end brings such a chunk here.
                    chunk = echo(chunk, st.echo)
                    count_tokens(chunk)
                    saw_done = _ends_stream(chunk)
                    if saw_done:
                        self._meter_stream_end(st, upstream_error)
                    if sent is not None:
                        sent.append(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    if saw_done:
                        break
                    continue
                out = held
                for event in splitter.feed(chunk):
                    if event.startswith(b"data: [DONE]"):
                        saw_done = True
                        out.append(DONE)
                        continue
                    usage, usage_only = usage_of_event(event)
                    if usage is not None:
                        st.usage = usage
                        if usage_only and not req.include_usage:
                            continue  # we asked for it for metering; the client did not
                    elif is_error_event(event):
                        upstream_error = True
                    else:
                        st.chunks += 1
                    out.append(echo(event, st.echo))
                if not out:
                    continue
                now = time.monotonic()
                if not st.response_started:
                    if not any(carries_output(ev) for ev in out):
                        held = out  # nothing generated yet: a failure now can still be retried elsewhere
                        continue
                    held = []
                    st.ttft_ms = (now - st.t0) * 1000
                    self.metrics.child(self.metrics.ttft, *labels).observe(now - st.t0)
                    assert st.variant is not None
                    self.signals.ttft(st.variant.served_model_name, now - st.t0)
                    self.router.first_byte(ticket, now)
                    headers = SSE_HEADERS + _headers({**st.rate_headers, "x-request-id": st.request_id})
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    st.response_started = True
                    if write_now is not None and sent is None:
                        resp.set_sink(forward_now)
                else:
                    itl_hist.observe(now - last)
                last = load.last_progress = now
                if saw_done:
                    self._meter_stream_end(st, upstream_error)
                body = b"".join(out)
                if sent is not None:
                    sent.append(body)
                await send({"type": "http.response.body", "body": body, "more_body": True})
                out.clear()
                if saw_done:
                    break
        except (UpstreamError, TimeoutError, OSError) as exc:
            failure = exc
        resp.set_sink(None)  # whatever the engine still sends must not reach a finished response
        if not st.response_started:
            self.metrics.child(self.metrics.errors, req.model, ticket.replica.id, "before_first_byte").inc()
            refused = next((engine_stream_refusal(ev) for ev in held if is_error_event(ev)), None)
            if refused is not None:  # the engine refused the request in an error event: a 4xx
                self._release(st, ticket, None)
                raise refused
            self._release(st, ticket, None)  # judged once another replica has had the request
            return Failure(ticket.replica.id, "broke")
        if saw_done and not upstream_error:
            self._release(st, ticket, True, _reported(st.usage))
            st.status, st.http_status = "ok", 200
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if sent is not None and fill is not None and (whole := assemble(b"".join(sent), st.usage)) is not None:
                fill(whole)
            if not resp.complete:
                # The client is done; read the engine's end of body so the connection can be reused.
                with contextlib.suppress(UpstreamError, TimeoutError, OSError):
                    async for _ in resp.iter_chunks(0.5):
                        pass
            return DONE_OK
        # Failed after the first byte: the client gets an error event and [DONE] now, never a hang.
        log.info("stream from replica %s broke: %r", ticket.replica.id, failure)
        self.metrics.child(self.metrics.errors, req.model, ticket.replica.id, "mid_stream").inc()
        self._release(st, ticket, False if not upstream_error else True)
        st.status, st.http_status = "error", 200
        tail = b"" if upstream_error else error_event("The model replica failed while streaming; please retry.")
        if not saw_done:
            tail += DONE
        self._meter(st)
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return DONE_ERROR

    # ------------------------------------------------------------------ accounting

    def _counts(self, st: RequestState) -> tuple[int, int, int]:
        prompt, completion, cached = token_counts(st.usage)
        req = st.req
        if req is not None and st.usage is None and st.ticket is not None:
            # No usage from the engine (aborted or broken): meter what we know went through.
            prompt, completion = req.prompt_tokens_est, st.chunks
        return prompt, completion, cached

    def _meter_stream_end(self, st: RequestState, upstream_error: bool) -> None:
        """The chunk carrying ``[DONE]`` is about to go out: the request is answered."""
        st.status, st.http_status = ("error" if upstream_error else "ok"), 200
        self._meter(st)

    def _meter(self, st: RequestState) -> None:
        """The request's usage event, once, into the spool: called before the response's final bytes
        are sent, so an edge killed after answering has the event on disk (``usage.py``)."""
        if st.metered or st.tenant is None or self.usage is None:
            return  # unauthenticated: nobody to bill
        st.metered = True
        prompt, completion, cached = self._counts(st)
        request_id = st.request_id
        if st.batch_line and (st.status == "client_abort" or st.http_status == 429 or st.http_status >= 500):
            # An attempt the batch runner may send again (controlplane.batches.runner): metered as
            # itself, so that the line's id, which usage counts once, is left for the answer it keeps.
            request_id = f"{request_id}~{os.urandom(4).hex()}"
        self.usage.record(make_event(
            request_id=request_id, tenant_id=st.tenant.id, key_id=st.key.id if st.key else None,
            variant_id=st.variant.id if st.variant else None, model=st.model,
            region=st.replica.region if st.replica else None, replica_id=st.replica.id if st.replica else None,
            prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
            queue_ms=st.queue_ms, ttft_ms=st.ttft_ms, duration_ms=(time.monotonic() - st.t0) * 1000,
            status=st.status, http_status=st.http_status, ts=st.ts, cache=st.cache,
        ))

    def _finish(self, st: RequestState) -> None:
        """Runs exactly once per request, whatever happened: frees capacity, settles limits, meters
        (unless metered before its last bytes went out)."""
        now = time.monotonic()
        if st.ticket is not None and not st.ticket.closed:
            self._release(st, st.ticket, None)
        prompt, completion, cached = self._counts(st)
        req = st.req
        if st.usage is not None and req is not None:
            self.estimator.observe(len(req.prompt_text), prompt)
            self.index.calibrate(self.estimator.chars_per_token)
        if st.lease is not None:
            self._spawn(self.limiter.settle(st.lease, prompt + completion))
        model = st.model or "unknown"
        duration = now - st.t0
        if st.variant is not None and st.http_status in (429, 503):
            self.signals.rejected(st.variant.served_model_name, rejection_reason(st.http_status, st.error_code))
        self.metrics.child(self.metrics.requests, model, st.priority, st.status, str(st.http_status)).inc()
        self.metrics.child(self.metrics.duration, model, st.priority).observe(duration)
        if st.replica is not None and st.usage is not None:
            rid = st.replica.id
            self.metrics.child(self.metrics.prompt_tokens, model, rid).inc(prompt)
            self.metrics.child(self.metrics.cached_tokens, model, rid).inc(cached)
            self.metrics.child(self.metrics.completion_tokens, model, rid).inc(completion)
        if st.tenant is not None and st.variant is not None and completion:
            self.admission.queue(st.variant.id).charge_output(st.tenant.id, st.tenant.weight, completion)
        self._meter(st)
