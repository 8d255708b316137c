"""Latency and throughput of the main admin and tenant endpoints at concurrency 32, on Postgres.

    .venv/bin/python -m bench.controlplane.api_latency [--seconds 10] [--concurrency 32] [--workers 1]

Starts the real control plane under uvicorn against a fresh Postgres database (dropped at the
end), seeds tenants, keys and usage, then drives each endpoint with an async HTTP client at a
fixed concurrency and prints p50/p99 latency and requests/s per endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import subprocess
import sys
import time
import uuid

import httpx
import psycopg

from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.migrate import upgrade
from controlplane.services import usage

PG = os.environ.get("NIMBUS_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
ADMIN = "bench-admin-token-0123456789"


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def drive(client: httpx.AsyncClient, make_request, seconds: float, concurrency: int) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal errors
        n = 0
        while time.perf_counter() < deadline:
            method, path, kw = make_request(i, n)
            t0 = time.perf_counter()
            r = await client.request(method, path, **kw)
            latencies.append(time.perf_counter() - t0)
            if r.status_code >= 400:
                errors += 1
            n += 1

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return latencies, errors


async def run(url: str, seconds: float, concurrency: int, tenant_id: str, secret: str) -> list[tuple]:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    tenant = {"Authorization": f"Bearer {secret}"}
    start = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=6)).isoformat()
    cases = [
        ("admin GET /admin/v1/tenants?limit=50", lambda i, n: ("GET", "/admin/v1/tenants?limit=50", {"headers": admin})),
        ("admin POST /admin/v1/tenants", lambda i, n: ("POST", "/admin/v1/tenants",
                                                      {"headers": admin, "json": {"name": f"b-{uuid.uuid4().hex[:12]}"}})),
        ("admin GET /admin/v1/tenants/{id}", lambda i, n: ("GET", f"/admin/v1/tenants/{tenant_id}", {"headers": admin})),
        ("tenant GET /v1/tenant/me", lambda i, n: ("GET", "/v1/tenant/me", {"headers": tenant})),
        ("tenant GET /v1/tenant/keys", lambda i, n: ("GET", "/v1/tenant/keys", {"headers": tenant})),
        ("tenant GET /v1/tenant/usage (6 h, hourly)", lambda i, n: ("GET", "/v1/tenant/usage",
                                                                    {"headers": tenant, "params": {"start": start}})),
    ]
    rows = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        for name, make in cases:
            await drive(client, make, 1.0, concurrency)  # warm-up
            lat, errors = await drive(client, make, seconds, concurrency)
            rows.append((name, len(lat) / seconds, percentile(lat, 0.5) * 1000, percentile(lat, 0.99) * 1000,
                         statistics.mean(lat) * 1000, errors))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()

    db = f"nimbus_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    url_db = PG.replace("postgresql://", "postgresql+psycopg://").rsplit("/", 1)[0] + f"/{db}"
    port = 18000 + os.getpid() % 1000
    env = {**os.environ, "NIMBUS_DATABASE_URL": url_db, "NIMBUS_ADMIN_TOKEN": ADMIN, "NIMBUS_DB_POOL_SIZE": "20"}
    server = None
    try:
        upgrade(url_db)
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "controlplane.api.asgi:app", "--port", str(port), "--workers",
             str(args.workers), "--log-level", "warning", "--no-access-log"], env=env)
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(base + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        h = {"Authorization": f"Bearer {ADMIN}"}
        tenant = httpx.post(base + "/admin/v1/tenants", json={"name": "bench-tenant"}, headers=h).json()
        secret = httpx.post(base + f"/admin/v1/tenants/{tenant['id']}/keys",
                            json={"scopes": ["inference", "manage"]}, headers=h).json()["secret"]
        model = httpx.post(base + "/admin/v1/models", headers=h, json={"name": "bench-model", "variants": [
            {"tier": "bf16", "model_path": "m", "gpu_memory_gb": 10, "context_length": 8192}]}).json()
        # six hours of per-minute usage for the tenant
        now = time.time()
        events = [{"request_id": f"e{i}", "tenant_id": tenant["id"], "variant_id": model["variants"][0]["id"],
                   "ts": str(now - i * 60), "prompt_tokens": "500", "completion_tokens": "100", "status": "ok"}
                  for i in range(360)]
        with session_scope(Settings(database_url=url_db)) as s:
            usage.ingest(s, events)
        rows = asyncio.run(run(base, args.seconds, args.concurrency, tenant["id"], secret))
        print(f"\ncontrol plane API on Postgres, uvicorn workers={args.workers}, concurrency={args.concurrency}, "
              f"{args.seconds:.0f} s per endpoint, {os.cpu_count()} CPUs (load generator on the same machine)\n")
        print(f"{'endpoint':<44} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'errors':>7}")
        for name, rps, p50, p99, mean, errors in rows:
            print(f"{name:<44} {rps:>8.0f} {p50:>8.1f} {p99:>8.1f} {mean:>8.1f} {errors:>7}")
    finally:
        if server:
            server.terminate()
            server.wait(10)
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
