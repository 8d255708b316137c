"""Operator views: tenants and quotas, pools with replicas by state, GPU and KV use, autoscaler
decisions with their reasons, the GPU fleet (billed vs allocated GPUs, $/hour by pool), nodes with
their GPU slot maps, operations and failover history.

Operators sign in with the admin token once; the console keeps a separate operator session and
the token itself never reaches a page or a cookie.
"""

from __future__ import annotations

import uuid

from litestar import Controller, Request, Response, get, post
from litestar.di import Provide
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api import signin
from controlplane.config import Settings
from controlplane.console import auth, sessions, stability, views
from controlplane.console.web import login_page, page, redirect
from controlplane.services import fleet_views
from controlplane.services.errors import TooManyAttempts
from controlplane.services.signin_throttle import Subject


class OperatorAuthController(Controller):
    path = "/console/admin"

    @get("/login")
    async def login_form(self) -> Response:
        return login_page("operator/login.html")

    @post("/login")
    async def login(self, request: Request, db: AsyncSession, settings: Settings) -> Response:
        form = await auth.checked_login_form(request)
        sub = Subject("admin_token", "admin", signin.caller_address(request))
        try:
            begun = await signin.begin(request, sub, precount=True)
        except TooManyAttempts as exc:
            return login_page("operator/login.html", status_code=429, headers=exc.headers, error=exc.detail,
                              throttled=True)
        if not auth.admin_token_ok(settings, form.get("token", "")):
            verdict = await signin.throttle(request).failed(sub, begun)
            signin.record_failure(db, sub, verdict, channel="console", account_label="admin")
            error = "That admin token did not work."
            if verdict.retry_after_s > 0:
                error += " " + signin.failure_wait_message(verdict)
            return login_page("operator/login.html", status_code=401, error=error,
                              throttled=verdict.retry_after_s > 0)
        await signin.throttle(request).succeeded(sub, begun)
        signin.record_success(db, sub, actor="admin", channel="console", account_label="admin")
        live = await sessions.start(db, kind="operator", signin_label=auth.admin_token_fingerprint(settings))
        return redirect("/console/admin", cookies=[
            sessions.cookie(sessions.OPERATOR_COOKIE, live.token, int(sessions.SESSION_TTL.total_seconds())),
            sessions.expired_cookie(sessions.LOGIN_CSRF_COOKIE),
        ])

    @post("/logout", dependencies={"live": Provide(auth.provide_operator_session)})
    async def logout(self, request: Request, db: AsyncSession, live: sessions.Live) -> Response:
        await auth.checked_form(request, live)
        await sessions.end(db, live)
        return redirect("/console/admin/login", cookies=[sessions.expired_cookie(sessions.OPERATOR_COOKIE)])


class OperatorConsoleController(Controller):
    path = "/console/admin"
    dependencies = {"live": Provide(auth.provide_operator_session)}

    @get("/")
    async def tenants_page(self, db: AsyncSession, live: sessions.Live) -> Response:
        rows, total = await views.tenant_rows(db)
        return page("operator/tenants.html", live, nav="tenants", operator=True, tenants=rows, total=total)

    @get("/pools")
    async def pools_page(self, db: AsyncSession, live: sessions.Live) -> Response:
        rows = await views.pool_rows(db)
        decisions = await views.recent_decisions(db, [r.pool.id for r in rows])
        names = {r.pool.id: r.pool.name for r in rows}
        return page("operator/pools.html", live, nav="pools", operator=True, pools=rows, decisions=decisions[:30],
                    pool_names=names)

    @get("/pools/{pool_id:uuid}")
    async def pool_page(self, db: AsyncSession, live: sessions.Live, pool_id: uuid.UUID) -> Response:
        row, decisions, ops = await views.pool_detail(db, pool_id)
        node_ids = {r.node_id for r in row.replicas}
        node_briefs = await fleet_views.node_briefs(db, node_ids)
        return page("operator/pool.html", live, nav="pools", operator=True, row=row, decisions=decisions,
                    operations=ops, node_briefs=node_briefs, restarts=await views.replica_restarts(db, node_ids))

    @get("/fleet")
    async def fleet_page(self, db: AsyncSession, live: sessions.Live, settings: Settings) -> Response:
        stability.PAUSED.bind(settings)
        return page("operator/fleet.html", live, nav="fleet", operator=True,
                    summary=await fleet_views.load_fleet_summary(db), pauses=await stability.eviction_pauses(db))

    @get("/nodes")
    async def nodes_page(self, db: AsyncSession, live: sessions.Live, settings: Settings) -> Response:
        stability.PAUSED.bind(settings)
        nodes = await views.nodes(db)
        return page("operator/nodes.html", live, nav="nodes", operator=True, nodes=nodes,
                    uses=await fleet_views.node_uses(db, nodes), pauses=await stability.eviction_pauses(db))

    @get("/nodes/{node_id:uuid}")
    async def node_page(self, db: AsyncSession, live: sessions.Live, node_id: uuid.UUID) -> Response:
        node = await fleet_views.load_node_page(db, node_id)
        return page("operator/node.html", live, nav="nodes", operator=True, node=node, operations=node.operations,
                    restarts=await views.replica_restarts(db, [node_id]))

    @get("/operations")
    async def operations_page(self, db: AsyncSession, live: sessions.Live) -> Response:
        return page("operator/operations.html", live, nav="operations", operator=True,
                    operations=await views.operations(db))
