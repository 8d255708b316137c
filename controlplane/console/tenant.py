"""Tenant pages: sign-in, dashboard, keys, models, usage, latency and the playground.

Every read passes ``live.row.tenant_id`` (the signed-in tenant) to the services, which scope
their queries by it; nothing here takes a tenant id from the URL or the form.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Annotated

from litestar import Controller, Request, Response, get, post
from litestar.di import Provide
from litestar.params import Parameter
from litestar.response import Stream
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api import signin
from controlplane.config import Settings
from controlplane.console import auth, charts, metrics, playground, sessions, views
from controlplane.console.web import login_page, page, redirect
from controlplane.db.types import utcnow
from controlplane.schemas.tenancy import CacheSettings, KeyCreate, KeyUpdate
from controlplane.services import caching, catalog_views, keys, tenants, usage
from controlplane.services.errors import FieldError, Forbidden, Invalid, ServiceError, TooManyAttempts
from controlplane.services.keys import KeyVerifier
from controlplane.services.signin_throttle import Subject

RangeParam = Annotated[str, Parameter(default=metrics.DEFAULT_RANGE, pattern=r"^(1h|24h|7d)$")]
GranularityParam = Annotated[str, Parameter(default="hour", pattern=r"^(minute|hour|day)$")]
EXPIRY_CHOICES = {"never": None, "7d": dt.timedelta(days=7), "30d": dt.timedelta(days=30),
                  "90d": dt.timedelta(days=90)}


# The create-key form's model checkboxes are fields named MODEL_FIELD + "name" or "name:tier".
MODEL_FIELD = "model__"


def problem_text(exc: ServiceError) -> str:
    """What a form shows for a refused change: the problem and each field's reason."""
    details = "; ".join(f"{e.field}: {e.message}" for e in exc.errors)
    return f"{exc.detail} ({details})" if details else exc.detail


def checked_models(form) -> list[str]:
    """The allowlist a keys form asks for: its checked ``model__<name or name:tier>`` boxes."""
    return sorted(k[len(MODEL_FIELD):] for k in form if k.startswith(MODEL_FIELD))


def model_choices(models: list) -> list[tuple[str, str]]:
    """(value, label) per allowlist entry the form offers: each model (every tier), and each tier of
    a model that has several."""
    out = []
    for m in models:
        out.append((m.name, f"{m.name} (every tier)" if len(m.tiers) > 1 else m.name))
        if len(m.tiers) > 1:
            out += [(f"{m.name}:{t}", f"{m.name}:{t}") for t in m.tiers]
    return out


def _pct(v: float) -> str:
    return f"{v * 100:.0f}%"


def _ms(v: float) -> str:
    return f"{v:,.0f} ms"


class TenantAuthController(Controller):
    path = "/console"

    @get("/", name="console:home")
    async def home(self) -> Response:
        return redirect("/console/dashboard")

    @get("/login")
    async def login_form(self) -> Response:
        return login_page("login.html")

    @post("/login")
    async def login(self, request: Request, db: AsyncSession, key_verifier: KeyVerifier) -> Response:
        form = await auth.checked_login_form(request)
        await sessions.sweep_expired(db)  # sign-ins keep the table small without a scheduled job
        by_password = form.get("method") == "password"
        email, address = form.get("email", ""), signin.caller_address(request)
        sub = (Subject("password", signin.email_account(email), address) if by_password
               else Subject("api_key", signin.api_key_account(form.get("api_key", "")), address))
        sticky = {"method": "password" if by_password else "key", "email": email}
        try:
            # Counted as a failure before the secret is checked: parallel guesses cannot slip through.
            begun = await signin.begin(request, sub, precount=True)
        except TooManyAttempts as exc:
            return login_page("login.html", status_code=429, headers=exc.headers, error=exc.detail, throttled=True,
                              **sticky)
        if by_password:
            holder, tenant = await auth.check_password(db, email, form.get("password", ""))
            live = tenant and await sessions.start(
                db, kind="tenant", tenant_id=tenant.id, signin_label="console-password",
                scopes=frozenset({"inference", "manage"}),
            )
            label, tenant_id = (sub.account, holder.id) if holder else (signin.typed_label(sub.account), None)
            actor = f"tenant:{tenant.id} password" if tenant else ""
        else:
            principal = await auth.tenant_by_key(db, key_verifier, form.get("api_key", ""))
            live = principal and await sessions.start(
                db, kind="tenant", tenant_id=principal.tenant_id, signin_key_id=principal.key_id,
                signin_label=principal.key_prefix or "", scopes=principal.scopes,
            )
            label = sub.account
            tenant_id = principal.tenant_id if principal else await signin.key_tenant(db, sub.account)
            actor = principal.actor if principal else ""
        if not live:
            verdict = await signin.throttle(request).failed(sub, begun)
            signin.record_failure(db, sub, verdict, channel="console", account_label=label, tenant_id=tenant_id)
            error = "Those credentials did not work. Keys need the 'manage' scope."
            if verdict.retry_after_s > 0:
                error += " " + signin.failure_wait_message(verdict)
            return login_page("login.html", status_code=401, error=error, throttled=verdict.retry_after_s > 0,
                              **sticky)
        await signin.throttle(request).succeeded(sub, begun)
        signin.record_success(db, sub, actor=actor, channel="console", account_label=label, tenant_id=tenant_id)
        if "inference" in live.row.scopes:
            # Minted now so it has reached the edges by the time the playground is opened.
            await sessions.playground_key(db, live)
        return redirect("/console/dashboard", cookies=[
            sessions.cookie(sessions.TENANT_COOKIE, live.token, int(sessions.SESSION_TTL.total_seconds())),
            sessions.expired_cookie(sessions.LOGIN_CSRF_COOKIE),
        ])

    @post("/logout", dependencies={"live": Provide(auth.provide_tenant_session)})
    async def logout(self, request: Request, db: AsyncSession, live: sessions.Live) -> Response:
        await auth.checked_form(request, live)
        await sessions.end(db, live)
        request.app.state.key_verifier.forget_all()
        return redirect("/console/login", cookies=[sessions.expired_cookie(sessions.TENANT_COOKIE)])


class TenantConsoleController(Controller):
    path = "/console"
    dependencies = {"live": Provide(auth.provide_tenant_session)}

    async def _tenant(self, db: AsyncSession, live: sessions.Live):
        return tenants.tenant_out(await tenants.get(db, live.row.tenant_id))

    @get("/dashboard")
    async def dashboard(self, db: AsyncSession, live: sessions.Live, range: RangeParam = "24h") -> Response:
        start, end, step = metrics.window(range, utcnow())
        report = await usage.report(db, live.row.tenant_id, start=start, end=end, granularity="minute")
        points = metrics.timeline(report, start, end, step)
        times = [p.start for p in points]
        chart_list = [
            {"title": title, "svg": svg} for title, svg in (
                ("Requests", charts.bar_chart("chart-requests", "Requests", times, [p.requests for p in points], step)),
                ("Tokens", charts.bar_chart("chart-tokens", "Tokens (prompt + completion)", times,
                                            [p.tokens for p in points], step)),
                ("Time to first token: p50 (blue), p95 (red)", charts.line_chart(
                    "chart-ttft", "Time to first token (p50, p95)", times,
                    [("p50", [p.ttft_p50 for p in points]), ("p95", [p.ttft_p95 for p in points])], step, fmt=_ms)),
                ("Prompt cache hit rate", charts.line_chart(
                    "chart-cache", "Prompt cache hit rate", times, [("hit rate", [p.cache_hit_rate for p in points])],
                    step, fmt=_pct, y_max=1.0)),
                ("Errors", charts.bar_chart("chart-errors", "Errors", times, [p.errors for p in points], step)),
            )
        ]
        total = report.total
        summary = {
            "requests": total.requests, "tokens": total.prompt_tokens + total.completion_tokens,
            "errors": total.errors, "cache_hit_rate": total.cache_hit_rate,
            "ttft_p50": metrics.overall_ttft(points, 0.5), "ttft_p95": metrics.overall_ttft(points, 0.95),
        }
        return page("dashboard.html", live, nav="dashboard", tenant=await self._tenant(db, live), charts=chart_list,
                    points=[p for p in points if p.requests], summary=summary, range=range,
                    ranges=list(metrics.RANGES), step=step)

    # ---------------------------------------------------------------- keys
    async def _keys_page(self, db: AsyncSession, live: sessions.Live, status_code: int = 200, **extra) -> Response:
        rows, _ = await keys.list_for_tenant(db, live.row.tenant_id, include_revoked=True, limit=200, offset=0)
        rows.sort(key=lambda k: (k.revoked_at is not None, k.created_at), reverse=False)
        models = await catalog_views.models_for_tenant(db, live.row.tenant_id)
        return page("keys.html", live, status_code=status_code, nav="keys", tenant=await self._tenant(db, live),
                    keys=[keys.key_out(k) for k in rows], expiry_choices=list(EXPIRY_CHOICES),
                    model_choices=model_choices(models), can_manage="manage" in live.row.scopes, **extra)

    @get("/keys")
    async def keys_page(self, db: AsyncSession, live: sessions.Live,
                        revoked: Annotated[str | None, Parameter(default=None, max_length=16)] = None) -> Response:
        return await self._keys_page(db, live, revoked=revoked)

    @post("/keys")
    async def create_key(self, request: Request, db: AsyncSession, live: sessions.Live) -> Response:
        form = await auth.checked_form(request, live)
        scopes = [s for s in ("inference", "manage") if form.get(f"scope_{s}")]
        expiry = EXPIRY_CHOICES.get(form.get("expires", "never"))
        try:
            if not scopes:
                raise Invalid("choose at least one scope", [FieldError("scopes", "choose at least one")])
            allowed = checked_models(form)
            body = KeyCreate(name=form.get("name", "").strip()[:200], scopes=scopes,
                             expires_at=utcnow() + expiry if expiry else None, allowed_models=allowed or None)
            key, secret = await keys.create(db, live.principal, live.row.tenant_id, body)
        except ServiceError as exc:
            return await self._keys_page(db, live, status_code=exc.status, error=problem_text(exc))
        # Rendered straight from the POST (no redirect, no-store): this response is the only place
        # the secret ever appears.
        return await self._keys_page(db, live, status_code=201, created=keys.key_out(key), secret=secret)

    @post("/keys/{key_id:uuid}/models")
    async def change_key_models(self, request: Request, db: AsyncSession, live: sessions.Live,
                                key_id: uuid.UUID) -> Response:
        """The models an existing key may call (none checked: every model); the edges apply it with
        their next snapshot."""
        form = await auth.checked_form(request, live)
        try:
            key = await keys.change(db, live.principal, live.row.tenant_id, key_id,
                                    KeyUpdate(allowed_models=checked_models(form) or None))
        except ServiceError as exc:
            return await self._keys_page(db, live, status_code=exc.status, error=problem_text(exc))
        return await self._keys_page(db, live, changed=key.prefix)

    @post("/keys/{key_id:uuid}/revoke")
    async def revoke_key(self, request: Request, db: AsyncSession, live: sessions.Live, key_id: uuid.UUID) -> Response:
        await auth.checked_form(request, live)
        key = await keys.revoke(db, live.principal, live.row.tenant_id, key_id)
        request.app.state.key_verifier.forget_all()
        return redirect(f"/console/keys?revoked={key.prefix}")

    # ---------------------------------------------------------------- caching
    async def _cache_page(self, db: AsyncSession, live: sessions.Live, settings: Settings, *,
                          status_code: int = 200, **extra) -> Response:
        tenant = await tenants.get(db, live.row.tenant_id)
        models = await catalog_views.models_for_tenant(db, live.row.tenant_id)
        return page("cache.html", live, status_code=status_code, nav="cache", tenant=await self._tenant(db, live),
                    cache=caching.settings_out(tenant, settings), model_choices=[m.name for m in models],
                    can_manage="manage" in live.row.scopes, **{"purged": None, **extra})

    @get("/cache")
    async def cache_page(self, db: AsyncSession, live: sessions.Live, settings: Settings) -> Response:
        return await self._cache_page(db, live, settings)

    @post("/cache")
    async def change_cache(self, request: Request, db: AsyncSession, live: sessions.Live,
                           settings: Settings) -> Response:
        form = await auth.checked_form(request, live)
        if "manage" not in live.row.scopes:
            raise Forbidden("this key may not change settings (it lacks the manage scope)")
        try:
            threshold = form.get("semantic_cache_threshold", "").strip()
            try:
                value = float(threshold) if threshold else None
            except ValueError:
                raise Invalid("the threshold is not a number",
                              [FieldError("semantic_cache_threshold", "not a number")]) from None
            body = CacheSettings(response_cache=bool(form.get("response_cache")),
                                 semantic_cache_models=sorted(k.removeprefix("semantic__") for k in form
                                                              if k.startswith("semantic__")),
                                 semantic_cache_threshold=value)
            await caching.change(db, live.principal, settings, live.row.tenant_id, body)
        except ServiceError as exc:
            return await self._cache_page(db, live, settings, status_code=exc.status, error=problem_text(exc))
        return await self._cache_page(db, live, settings, saved=True)

    @post("/cache/purge")
    async def purge_cache(self, request: Request, db: AsyncSession, live: sessions.Live,
                          settings: Settings) -> Response:
        await auth.checked_form(request, live)
        if "manage" not in live.row.scopes:
            raise Forbidden("this key may not clear the cache (it lacks the manage scope)")
        purged = await asyncio.to_thread(caching.purge, settings.redis_url, settings.edge_redis_key_prefix,
                                         live.row.tenant_id)
        return await self._cache_page(db, live, settings, purged=purged)

    # ---------------------------------------------------------------- models, latency
    @get("/models")
    async def models_page(self, db: AsyncSession, live: sessions.Live) -> Response:
        return page("models.html", live, nav="models", tenant=await self._tenant(db, live),
                    models=await catalog_views.models_for_tenant(db, live.row.tenant_id))

    @get("/models/{name:str}")
    async def model_page(self, db: AsyncSession, live: sessions.Live, name: str) -> Response:
        model = await views.visible_model(db, live.row.tenant_id, name)
        rows = await views.latency_breakdowns(db, live.row.tenant_id, since=dt.timedelta(days=1), model=name)
        return page("model.html", live, nav="models", tenant=await self._tenant(db, live), model=model,
                    breakdowns=rows, stacks=_stacks(rows))

    @get("/latency")
    async def latency_page(self, db: AsyncSession, live: sessions.Live, range: RangeParam = "24h") -> Response:
        since = metrics.RANGES[range][0]
        rows = await views.latency_breakdowns(db, live.row.tenant_id, since=since)
        return page("latency.html", live, nav="latency", tenant=await self._tenant(db, live), breakdowns=rows,
                    stacks=_stacks(rows), range=range, ranges=list(metrics.RANGES))

    # ---------------------------------------------------------------- usage
    async def _usage(self, db: AsyncSession, live: sessions.Live, range: str, granularity: str):
        start, end, _ = metrics.window(range, utcnow())
        report = await usage.report(db, live.row.tenant_id, start=start, end=end, granularity=granularity)
        return report, metrics.usage_rows(report)

    @get("/usage")
    async def usage_page(self, db: AsyncSession, live: sessions.Live, range: RangeParam = "24h",
                         granularity: GranularityParam = "hour") -> Response:
        report, rows = await self._usage(db, live, range, granularity)
        return page("usage.html", live, nav="usage", tenant=await self._tenant(db, live), rows=rows,
                    total=report.total, range=range, ranges=list(metrics.RANGES), granularity=granularity)

    @get("/usage.csv")
    async def usage_csv(self, db: AsyncSession, live: sessions.Live, range: RangeParam = "24h",
                        granularity: GranularityParam = "hour") -> Response:
        _, rows = await self._usage(db, live, range, granularity)
        return Response(
            content=metrics.to_csv(rows), media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="nimbus-usage-{range}-{granularity}.csv"'},
        )

    # ---------------------------------------------------------------- playground
    @get("/playground")
    async def playground_page(self, db: AsyncSession, live: sessions.Live) -> Response:
        models = await catalog_views.models_for_tenant(db, live.row.tenant_id)
        return page("playground.html", live, nav="playground", tenant=await self._tenant(db, live), models=models,
                    can_infer="inference" in live.row.scopes, max_tokens_limit=playground.MAX_TOKENS_LIMIT)

    @post("/playground/stream")
    async def playground_stream(self, request: Request, db: AsyncSession, live: sessions.Live,
                                settings: Settings) -> Response:
        form = await auth.checked_form(request, live)
        requested = form.get("model", "")
        await views.visible_model(db, live.row.tenant_id, requested.partition(":")[0])
        message = form.get("message", "").strip()
        if not message:
            raise Invalid("write a message first", [FieldError("message", "required")])
        if "inference" not in live.row.scopes:
            raise Forbidden("this session's key lacks the 'inference' scope")
        try:
            max_tokens = int(form.get("max_tokens") or 128)
        except ValueError:
            max_tokens = 128
        secret, created_at = await sessions.playground_key(db, live)
        await db.commit()  # the key must be visible to the edge's next snapshot before we call it
        body = playground.chat_body(requested, message, max_tokens)
        return Stream(playground.stream_chat(settings.edge_url, secret, created_at, body),
                      media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


def _stacks(rows: list[metrics.Breakdown]) -> dict[str, object]:
    return {
        f"{b.model}:{b.tier}": charts.stacked_bar(
            f"stack-{i}", f"Latency of {b.model} ({b.tier})",
            [("queueing", b.queue_ms or 0.0), ("prefill", b.prefill_ms or 0.0), ("generation", b.generation_ms or 0.0)],
        )
        for i, b in enumerate(rows) if b.requests
    }
