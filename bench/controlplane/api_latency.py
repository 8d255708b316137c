"""Latency and throughput of the main admin and tenant endpoints at concurrency 32, on Postgres.

    .venv/bin/python -m bench.controlplane.api_latency [--seconds 10] [--concurrency 32] [--workers 1]

Starts the real control plane under uvicorn against a fresh Postgres database (dropped at the
end), seeds tenants, keys and usage, then drives each endpoint at a fixed concurrency and prints
p50/p99 latency and requests/s per endpoint. The load comes from `wrk` (Debian package) when it
is installed: a Python client on the same two cores costs more CPU per request than the server
and would measure itself. Without wrk it falls back to an async httpx client and says so.
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


WRK_LUA = """
counter = 0
request = function()
  counter = counter + 1
  local body = string.format('{"name":"b-%s-%s-%d"}', RUN, wrk.thread_id or "t", counter)
  return wrk.format("POST", wrk.path, {["Content-Type"]="application/json", ["Authorization"]=AUTH}, body)
end
setup = function(thread) thread:set("id", tostring(math.random(1, 1e9))) end
init = function(args) wrk.thread_id = id end
"""


def wrk_case(url: str, path: str, headers: dict[str, str], seconds: float, concurrency: int,
             post_auth: str | None = None) -> tuple[float, float, float, float, int]:
    """(req/s, p50 ms, p99 ms, mean ms, non-2xx) measured by wrk."""
    import re
    import tempfile

    cmd = ["wrk", "-t2", f"-c{concurrency}", f"-d{seconds:.0f}s", "--latency"]
    for k, v in headers.items():
        cmd += ["-H", f"{k}: {v}"]
    script = None
    if post_auth is not None:
        script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
        # Lua's RNG restarts with the same seed in every wrk run: a per-run nonce keeps names unique.
        script.write(f'AUTH = "{post_auth}"\nRUN = "{uuid.uuid4().hex[:10]}"\n' + WRK_LUA)
        script.close()
        cmd += ["-s", script.name]
    out = subprocess.run([*cmd, url + path], capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float:
        m = re.search(rf"{label}\s+([\d.]+)(us|ms|s)", out)
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return rps, ms("50%"), ms("99%"), ms("Latency"), int(bad.group(1)) if bad else 0


def run_wrk(url: str, seconds: float, concurrency: int, tenant_id: str, secret: str) -> list[tuple]:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    tenant = {"Authorization": f"Bearer {secret}"}
    start = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cases = [
        ("admin GET /admin/v1/tenants?limit=50", "/admin/v1/tenants?limit=50", admin, None),
        ("admin POST /admin/v1/tenants", "/admin/v1/tenants", {}, f"Bearer {ADMIN}"),
        ("admin GET /admin/v1/tenants/{id}", f"/admin/v1/tenants/{tenant_id}", admin, None),
        ("tenant GET /v1/tenant/me", "/v1/tenant/me", tenant, None),
        ("tenant GET /v1/tenant/keys", "/v1/tenant/keys", tenant, None),
        ("tenant GET /v1/tenant/usage (6 h, hourly)", f"/v1/tenant/usage?start={start}", tenant, None),
    ]
    rows = []
    for name, path, headers, post_auth in cases:
        wrk_case(url, path, headers, 1, concurrency, post_auth)  # warm-up
        rows.append((name, *wrk_case(url, path, headers, seconds, concurrency, post_auth)))
    return rows


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
        import shutil

        use_wrk = shutil.which("wrk") is not None
        if use_wrk:
            rows = run_wrk(base, args.seconds, args.concurrency, tenant["id"], secret)
        else:
            rows = asyncio.run(run(base, args.seconds, args.concurrency, tenant["id"], secret))
        print(f"\ncontrol plane API on Postgres, uvicorn workers={args.workers}, concurrency={args.concurrency}, "
              f"{args.seconds:.0f} s per endpoint, {os.cpu_count()} CPUs, load from "
              f"{'wrk' if use_wrk else 'httpx (install wrk for a cheaper load generator)'} on the same machine\n")
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
