"""``make run``: the whole platform on this machine, with no external service.

Started here, each as its own process with its log under ``<state dir>/logs/``:

- the control plane API and console (uvicorn), on SQLite under the state dir (migrated here);
- a Celery worker and beat (``controlplane.tasks.app``), brokered by the private Redis below
  when there is one, else by kombu's filesystem transport (whose reader can catch a message
  file half written, which kills the worker: seen once in a few hundred runs);
- a private ``redis-server`` on a free port when the binary exists, for the Celery broker, the
  edge's limits and its usage stream. Without it the edge enforces limits locally and spools usage to
  ``<state dir>/edge/usage-spool.jsonl``: requests still work, but the usage pages stay empty
  until a Redis is reachable (the spool is replayed then);
- an edge proxy pulling snapshots from the API;
- and, through the reconcile pipeline and the ``local`` cloud, node agents running simulator
  replicas.

Then it seeds a demo (a tenant and a fresh API key, a model with bf16 and fp8 tiers, a local
pool of two replicas), waits until a completion streams through the edge, prints how to use it,
and runs until Ctrl-C, which stops everything it started (agents and their engines included).

While it runs it supervises the services: one that exits (a crash, a kill, an OOM) is logged and
started again after a backoff (0.5 s, 1 s, 2 s … at most 8 s), on the same port with the same
settings; the nodes and their engines are not touched (agents ride out an API or edge restart,
the edge serves from its last snapshot meanwhile). Only Ctrl-C (SIGINT or SIGTERM to this runner)
stops the platform, or a service that keeps failing: 5 exits within 60 s stop everything with a
message naming it and its log.

Options for tests and CI: ``--state-dir``, ``--api-port``/``--edge-port`` (0: any free port),
``--database-url`` (e.g. Postgres), ``--no-demo`` (no seeding: drive the admin API yourself),
``--status-file`` (JSON with URLs and tokens once ready). ``NIMBUS_EMBEDDED_API_PORT`` and
``NIMBUS_EMBEDDED_EDGE_PORT`` set the ports when ``make run`` is the caller.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_TENANT = "demo"
DEMO_MODEL = "demo-llama"
DEMO_POOL = "demo-llama-bf16"
# A second model, so the demo shows what GPU placement does: both pools' replicas share one node.
DEMO_MODEL_2 = "demo-qwen"
DEMO_POOL_2 = "demo-qwen-bf16"
DEMO_REPLICAS = 2  # per pool: 2 + 2 one-GPU replicas fit one 4-GPU node, cheaper than two 2-GPU ones
LOCAL_CATALOG: dict[str, Any] = {
    "version": 1,
    "generated_by": "nimbus embedded",
    "clouds": [{
        "name": "local",
        "regions": [{
            "name": "local",
            "template": {"kind": "local", "id": "local"},
            "zones": [{"name": "local-a"}],
            # Priced like the sample catalog's H100 (p5.48xlarge, 8 GPUs, $55.04/h on-demand): $6.88 per
            # GPU-hour on the 8-GPU shape, a small premium per GPU-hour on smaller ones (7.57, 7.22, 7.05),
            # spot at 40% of on-demand. So placement and consolidation see real shapes and real prices.
            "instance_types": [
                {"name": "sim-1gpu", "gpu_type": "sim", "gpu_count": 1, "gpu_memory_gb": 80,
                 "on_demand_price": 7.57, "spot_price": 3.028},
                {"name": "sim-2gpu", "gpu_type": "sim", "gpu_count": 2, "gpu_memory_gb": 80,
                 "on_demand_price": 14.44, "spot_price": 5.776},
                {"name": "sim-4gpu", "gpu_type": "sim", "gpu_count": 4, "gpu_memory_gb": 80,
                 "on_demand_price": 28.2, "spot_price": 11.28},
                {"name": "sim-8gpu", "gpu_type": "sim", "gpu_count": 8, "gpu_memory_gb": 80,
                 "on_demand_price": 55.04, "spot_price": 22.016},
            ],
        }],
    }],
}
DEMO_VARIANTS = [
    {"tier": "bf16", "model_path": "meta-llama/Llama-3.1-8B-Instruct", "gpu_memory_gb": 20, "context_length": 8192},
    {"tier": "fp8", "model_path": "meta-llama/Llama-3.1-8B-Instruct-FP8", "gpu_memory_gb": 12,
     "context_length": 8192, "quantization": "fp8"},
]
DEMO_VARIANTS_2 = [
    {"tier": "bf16", "model_path": "Qwen/Qwen2.5-7B-Instruct", "gpu_memory_gb": 18, "context_length": 8192},
]
# Agents inherit these through the worker that launches them (the local provider passes its
# environment on): fast heartbeats, a simulator 10× faster than real time, quick shutdowns.
AGENT_ENV = {
    "NIMBUS_AGENT_HEARTBEAT_S": "1",
    "NIMBUS_AGENT_SIM_ARGS": "--time-scale 10 --ready-delay 1",
    "NIMBUS_AGENT_DRAIN_GRACE_S": "2",  # > the edge's snapshot poll plus the API's snapshot cache
    "NIMBUS_AGENT_DRAIN_DEADLINE_S": "3",
    "NIMBUS_AGENT_BACKOFF_BASE_S": "0.5",
    # A restarted API is found again within a few seconds (the default cap is 30 s).
    "NIMBUS_AGENT_CP_RETRY_CAP_S": "5",
}
# Supervision: a service that exits is started again after min(cap, base * 2**(n-1)) for its n-th
# exit within the window; the n-th exit within the window with n == GIVE_UP_EXITS stops the platform.
RESTART_BASE_S = 0.5
RESTART_CAP_S = 8.0
GIVE_UP_EXITS = 5
GIVE_UP_WINDOW_S = 60.0
PLATFORM_ENV = {
    "NIMBUS_RECONCILE_INTERVAL_S": "1",
    "NIMBUS_USAGE_ROLLUP_INTERVAL_S": "2",
    "NIMBUS_RETRY_DELAY_S": "2",
    "NIMBUS_SWEEP_INTERVAL_S": "30",
    "NIMBUS_AUTOSCALE_INTERVAL_S": "2",
    "NIMBUS_DRAIN_TIMEOUT_S": "20",  # a laptop demo: drained nodes go away quickly
}


def free_port(preferred: int = 0) -> int:
    """``preferred`` if it can be bound now, else any free port."""
    for port in ((preferred, 0) if preferred else (0,)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


@dataclass
class Service:
    name: str
    argv: list[str]
    health_url: str | None = None
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    exits: list[float] = field(default_factory=list)  # monotonic times of exits the supervisor saw
    restart_at: float | None = None  # when the supervisor starts it again
    restarts: int = 0

    def start(self, env: dict[str, str], log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{self.name}.log", "ab") as log:
            # Own session: Ctrl-C reaches only this runner, which then stops everything in order.
            self.proc = subprocess.Popen(self.argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_leftover_group(self) -> None:
        """After its leader exited: anything else in its process group goes too, so the restarted
        service finds its port and files free."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def healthy(self) -> bool:
        if not self.alive() or self.health_url is None:
            return False
        try:
            return httpx.get(self.health_url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@dataclass
class Platform:
    state_dir: Path
    api_port: int
    edge_port: int
    database_url: str | None = None
    demo: bool = True
    status_file: Path | None = None
    console: Console = field(default_factory=Console)
    services: dict[str, Service] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)
    restart_base_s: float = RESTART_BASE_S
    restart_cap_s: float = RESTART_CAP_S
    give_up_exits: int = GIVE_UP_EXITS
    give_up_window_s: float = GIVE_UP_WINDOW_S
    demo_info: dict[str, str] | None = None  # what write_status writes, again after each restart

    # -- setup -------------------------------------------------------------------------
    def __post_init__(self) -> None:
        self.state_dir = self.state_dir.resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.state_dir / "logs"
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.edge_url = f"http://127.0.0.1:{self.edge_port}"
        self.secrets = self._secrets()
        self.redis_url: str | None = None

    def _secrets(self) -> dict[str, str]:
        """Admin and edge tokens: from the environment if given, else made once per state dir."""
        path = self.state_dir / "embedded-secrets.json"
        stored = json.loads(path.read_text()) if path.exists() else {}
        for name in ("admin_token", "edge_token"):
            stored[name] = os.environ.get(f"NIMBUS_{name.upper()}") or stored.get(name) or secrets.token_urlsafe(24)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(stored, f)
        return stored

    def env(self) -> dict[str, str]:
        # A stray agent setting in the operator's shell (a config path, a node id) must not reach the
        # local nodes; the demo's own tunables below are defaults the environment may override.
        env = {k: v for k, v in os.environ.items() if not k.startswith("NIMBUS_AGENT_")}
        for name, default in {**PLATFORM_ENV, **AGENT_ENV}.items():
            env[name] = os.environ.get(name, default)
        env.update({
            "NIMBUS_STATE_DIR": str(self.state_dir),
            "NIMBUS_ADMIN_TOKEN": self.secrets["admin_token"],
            "NIMBUS_EDGE_TOKEN": self.secrets["edge_token"],
            "NIMBUS_PUBLIC_URL": self.api_url,
            "NIMBUS_EDGE_URL": self.edge_url,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
        })
        if self.database_url:
            env["NIMBUS_DATABASE_URL"] = self.database_url
        if self.redis_url:
            env["NIMBUS_REDIS_URL"] = self.redis_url
            env["NIMBUS_BROKER_URL"] = self.broker_url()
        return env

    def broker_url(self) -> str | None:
        """Celery's queues in their own database of the private Redis (usage and limits use 0)."""
        return self.redis_url.rsplit("/", 1)[0] + "/1" if self.redis_url else None

    def settings(self):
        from controlplane.config import Settings

        return Settings(state_dir=self.state_dir, database_url=self.database_url, broker_url=self.broker_url())

    def step(self, text: str) -> None:
        self.console.print(f"[green]✓[/green] {text} [dim]({time.monotonic() - self.t0:.1f} s)[/dim]")

    # -- the run -----------------------------------------------------------------------
    def start(self) -> None:
        from controlplane.db.migrate import upgrade

        settings = self.settings()
        upgrade(settings.resolved_database_url)
        self.step(f"database ready ({'SQLite' if settings.is_sqlite else 'external'})")
        self._kill_leftovers()  # first: a leftover worker could launch nodes while the fleet is retired
        stopped = retire_fleet(settings, self.state_dir / "local-cloud")
        if stopped:
            self.step(f"stopped {stopped} node(s) left over from an earlier run")
        self._start_redis()
        python = sys.executable
        celery = [python, "-m", "celery", "-A", "controlplane.tasks.app"]
        started_here = {
            "api": Service("api", [python, "-m", "uvicorn", "controlplane.api.asgi:app", "--host", "127.0.0.1",
                                   "--port", str(self.api_port), "--log-level", "warning"], self.api_url + "/healthz"),
            "worker": Service("worker", [*celery, "worker", "--pool=solo", "--loglevel=WARNING",
                                         "--hostname", f"embedded-{os.getpid()}@%h"]),
            # Batches run on their own worker: one can take hours, and the fleet ticks must not wait.
            "batch-worker": Service("batch-worker", [*celery, "worker", "--pool=solo", "--loglevel=WARNING",
                                                     "-Q", "batches", "--hostname", f"embedded-batches-{os.getpid()}@%h"]),
            "beat": Service("beat", [*celery, "beat", "--loglevel=WARNING",
                                     "--schedule", str(self.state_dir / "celerybeat-schedule")]),
            "edge": Service("edge", [python, "-m", "dataplane.edge", "--control-plane-url", self.api_url,
                                     "--host", "127.0.0.1", "--port", str(self.edge_port),
                                     "--state-dir", str(self.state_dir / "edge"),
                                     "--redis-url", self.redis_url or "none", "--set", "snapshot_poll_s=0.5"],
                            self.edge_url + "/health"),
        }
        self.services |= started_here
        env = self.env()
        self.console.print("  starting the API, a Celery worker and beat, and the edge…")
        for name, service in started_here.items():
            # With the demo, beat (the only thing that schedules fleet ticks) starts once the demo
            # pools are sized: each pool's PATCH sets its size at once, and a tick between the two
            # would place the first pool's replicas alone (two half-used nodes instead of one).
            if name == "beat" and self.demo:
                continue
            service.start(env, self.log_dir)
        self._record_pids()
        self.wait_for(lambda: self.services["api"].healthy(), 60, "the API")
        self.step(f"API and console on {self.api_url}")
        self.wait_for(lambda: self.services["edge"].healthy(), 60, "the edge")
        self.step(f"edge on {self.edge_url}")

    def start_beat(self) -> None:
        """Start the scheduler held back by ``start`` for the demo (a no-op when it runs)."""
        beat = self.services["beat"]
        if beat.proc is None:
            beat.start(self.env(), self.log_dir)
            self._record_pids()

    # A runner killed with SIGKILL cannot clean up; the next one does, from this file.
    def _record_pids(self) -> None:
        pids = {name: [s.proc.pid, _start_time(s.proc.pid)] for name, s in self.services.items() if s.proc}
        (self.state_dir / "embedded-pids.json").write_text(json.dumps(pids))

    def _kill_leftovers(self) -> None:
        path = self.state_dir / "embedded-pids.json"
        if not path.exists():
            return
        for name, (pid, started) in json.loads(path.read_text()).items():
            if started is not None and _start_time(pid) == started:  # the same process, not a reused pid
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self.step(f"stopped {name} left over from an earlier run")
        path.unlink()

    def _start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            self.console.print("[yellow]![/yellow] no redis-server: limits stay local to the edge and usage is "
                               "spooled at the edge (usage pages stay empty until Redis is available)")
            return
        for _attempt in range(3):  # a free port can be taken by someone else before redis binds it
            port = free_port()
            redis = Service("redis", [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                                      "--appendonly", "no"])
            redis.start(dict(os.environ), self.log_dir)
            deadline = time.monotonic() + 10
            while redis.alive() and not _pong(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.1)
            if redis.alive() and _pong(port):
                break
            redis.stop()
        else:
            raise RuntimeError(f"redis-server would not start; see {self.log_dir / 'redis.log'}")
        self.services["redis"] = redis
        self._record_pids()
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        self.step(f"private Redis on port {port}")

    def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            for service in self.services.values():
                if service.proc is not None and service.proc.poll() is not None:
                    raise RuntimeError(f"{service.name} exited with {service.proc.returncode}; see "
                                       f"{self.log_dir / (service.name + '.log')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not ready after {timeout:.0f} s; logs in {self.log_dir}")
            time.sleep(0.1)

    # -- demo --------------------------------------------------------------------------
    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.api_url + "/admin/v1", timeout=30,
                            headers={"Authorization": f"Bearer {self.secrets['admin_token']}"})

    def seed_demo(self) -> dict[str, str]:
        with self.admin() as api:
            check(api.post("/catalog/import", json=LOCAL_CATALOG))
            tenants = check(api.get("/tenants", params={"limit": 500}))["items"]
            tenant = next((t for t in tenants if t["name"] == DEMO_TENANT), None) or check(
                api.post("/tenants", json={"name": DEMO_TENANT, "display_name": "Demo tenant"}))
            key = check(api.post(f"/tenants/{tenant['id']}/keys",
                                 json={"name": "make run", "scopes": ["inference", "manage"]}))
            models = check(api.get("/models", params={"limit": 500}))["items"]
            pools = check(api.get("/pools", params={"limit": 500}))["items"]
            demo_pools = []
            for name, display, variants, pool_name in (
                    (DEMO_MODEL, "Demo Llama (simulated)", DEMO_VARIANTS, DEMO_POOL),
                    (DEMO_MODEL_2, "Demo Qwen (simulated)", DEMO_VARIANTS_2, DEMO_POOL_2)):
                model = next((m for m in models if m["name"] == name), None) or check(
                    api.post("/models", json={"name": name, "display_name": display, "default_tier": "bf16",
                                              "variants": variants}))
                variant = next(v for v in model["variants"] if v["tier"] == "bf16")
                # Created empty and sized together below, before beat starts (``start_beat``): the
                # first fleet tick then places both pools' replicas at once (one shared node).
                pool = next((p for p in pools if p["name"] == pool_name), None) or check(
                    api.post("/pools", json={"name": pool_name, "variant_id": variant["id"],
                                             "placement": [{"cloud": "local", "region": "local"}],
                                             "min_replicas": 0, "max_replicas": 1}))
                demo_pools.append(pool)
            demo_pools = [
                check(api.patch(f"/pools/{p['id']}", json={"min_replicas": DEMO_REPLICAS, "max_replicas": DEMO_REPLICAS,
                                                          "paused": False}))
                if p["paused"] or p["min_replicas"] != DEMO_REPLICAS or p["max_replicas"] != DEMO_REPLICAS else p
                for p in demo_pools]
            pool = demo_pools[0]
        self.step(f"demo tenant '{DEMO_TENANT}', models '{DEMO_MODEL}' (bf16, fp8) and '{DEMO_MODEL_2}', "
                  f"pools '{DEMO_POOL}' and '{DEMO_POOL_2}'")
        return {"api_key": key["secret"], "pool_id": pool["id"], "model": DEMO_MODEL,
                "pool_ids": ",".join(p["id"] for p in demo_pools)}

    def wait_replicas(self, pool_id: str, want: int, timeout: float = 90) -> None:
        with self.admin() as api, self.console.status("starting replicas…") as status:
            deadline = time.monotonic() + timeout
            shown = -1
            while True:
                counts = check(api.get(f"/pools/{pool_id}"))["replicas_by_state"]
                ready = counts.get("ready", 0)
                if ready != shown:
                    status.update(f"replicas ready {ready}/{want} {counts}")
                    if ready:
                        self.step(f"replica {ready}/{want} ready")
                    shown = ready
                if ready >= want:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"replicas not ready after {timeout:.0f} s: {counts}; logs in "
                                       f"{self.state_dir / 'local-cloud' / 'instances'}")
                self.wait_for(lambda: True, 1, "")  # surfaces a dead service
                time.sleep(0.25)

    def show_gpu_map(self) -> None:
        """Which replica holds which GPU of which node: the two demo models share one node."""
        with self.admin() as api:
            pools = {p["id"]: p["name"] for p in check(api.get("/pools", params={"limit": 500}))["items"]}
            nodes = check(api.get("/nodes", params={"limit": 100}))["items"]
            replicas = check(api.get("/replicas", params={"limit": 500}))["items"]
        for node in nodes:
            if node["state"] not in ("booting", "ready"):
                continue
            slots = ["free"] * node["gpus_total"]
            for r in replicas:
                if r["node_id"] == node["id"] and r["state"] not in ("stopped", "failed"):
                    for g in r["gpu_ids"]:
                        if 0 <= g < len(slots):
                            slots[g] = pools.get(r["pool_id"], r["pool_id"][:8])
            cells = "  ".join(f"GPU{i}: {name}" for i, name in enumerate(slots))
            self.step(f"node {node['id'][:8]} ({node['instance_type']}): {cells}")

    def wait_edge_serves(self, api_key: str, model: str, timeout: float = 30) -> None:
        """One real completion through the edge, so the printed commands work as printed."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                r = httpx.post(self.edge_url + "/v1/chat/completions", timeout=30,
                               headers={"Authorization": f"Bearer {api_key}"},
                               json={"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
                if r.status_code == 200:
                    self.step("a completion streamed through the edge")
                    return
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.3)
        raise TimeoutError(f"the edge did not serve a completion in {timeout:.0f} s: {last}")

    def print_usage(self, demo: dict[str, str]) -> None:
        key, model = demo["api_key"], demo["model"]
        python = Path(sys.executable)  # the virtualenv's, which has the openai SDK
        with contextlib.suppress(ValueError):
            python = python.relative_to(Path.cwd())
        print(f"""
Nimbus is running. Console: {self.api_url}/console/login (sign in with the API key below)

export NIMBUS_EDGE_URL={self.edge_url}
export NIMBUS_API_KEY={key}

curl -sN $NIMBUS_EDGE_URL/v1/chat/completions -H "Authorization: Bearer $NIMBUS_API_KEY" -H 'Content-Type: application/json' -d '{{"model": "{model}", "stream": true, "messages": [{{"role": "user", "content": "Hello!"}}]}}'

{python} - <<'EOF'
import os, openai
client = openai.OpenAI(base_url=os.environ["NIMBUS_EDGE_URL"] + "/v1", api_key=os.environ["NIMBUS_API_KEY"])
for chunk in client.chat.completions.create(model="{model}", stream=True, messages=[{{"role": "user", "content": "Hello!"}}]):
    print(chunk.choices[0].delta.content or "" if chunk.choices else "", end="", flush=True)
print()
EOF

Admin API: {self.api_url}/admin/v1 with NIMBUS_ADMIN_TOKEN from {self.state_dir / 'embedded-secrets.json'}
Logs: {self.log_dir}  ·  Ctrl-C stops everything.
""", flush=True)

    def write_status(self, demo: dict[str, str] | None) -> None:
        self.demo_info = demo
        if self.status_file is None:
            return
        status = {"api_url": self.api_url, "edge_url": self.edge_url, "state_dir": str(self.state_dir),
                  "admin_token": self.secrets["admin_token"], "edge_token": self.secrets["edge_token"],
                  "redis_url": self.redis_url, "pids": {n: s.proc.pid for n, s in self.services.items() if s.proc},
                  **(demo or {})}
        tmp = self.status_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(status, f)
        tmp.replace(self.status_file)

    # -- shutdown ----------------------------------------------------------------------
    def stop(self) -> None:
        """Pipeline first (no new launches), then the nodes, then the edge, the API and Redis."""
        from sqlalchemy.exc import DBAPIError

        for name in ("beat", "worker", "batch-worker"):
            if name in self.services:
                self.services[name].stop()
        stopped = None
        try:
            # The local VMs stop first, then their rows. A connection the database dropped (a
            # Postgres restart during the run) fails once and is thrown out of the pool, so one
            # retry gets a fresh one; if the database stays away, the next start fixes the rows.
            for attempt in (1, 2):
                try:
                    stopped = retire_fleet(self.settings(), self.state_dir / "local-cloud")
                    break
                except DBAPIError as exc:
                    if attempt == 2:
                        self.console.print(f"[yellow]![/yellow] could not mark the nodes stopped ({type(exc).__name__});"
                                           " the next start does it")
        finally:
            for name in ("edge", "api", "redis"):
                if name in self.services:
                    self.services[name].stop()
            (self.state_dir / "embedded-pids.json").unlink(missing_ok=True)
        self.console.print(f"stopped {len(self.services)} services and "
                           f"{'?' if stopped is None else stopped} node(s)")

    def supervise(self, stop: threading.Event, poll_s: float = 0.2) -> str | None:
        """Until ``stop`` is set (a signal; returns None): a service that exits is logged and started
        again after a capped backoff. One that exits ``give_up_exits`` times within
        ``give_up_window_s`` ends the run: returns why, and the caller stops the platform."""
        while not stop.wait(poll_s):
            now = time.monotonic()
            for service in list(self.services.values()):
                if service.proc is None:
                    continue
                if service.restart_at is not None:
                    if now >= service.restart_at and not stop.is_set():
                        self._restart(service)
                    continue
                code = service.proc.poll()
                if code is None:
                    continue
                service.kill_leftover_group()
                service.exits = [t for t in service.exits if now - t < self.give_up_window_s] + [now]
                log = self.log_dir / f"{service.name}.log"
                n = len(service.exits)
                if n >= self.give_up_exits:
                    why = (f"{service.name} keeps failing: it exited {n} times within {self.give_up_window_s:.0f} s "
                           f"(last {_exit_text(code)}); stopping the platform. See {log}")
                    self.console.print(f"[red]✗[/red] {why}")
                    return why
                delay = min(self.restart_cap_s, self.restart_base_s * 2 ** (n - 1))
                service.restart_at = now + delay
                self.console.print(
                    f"[yellow]![/yellow] {service.name} {_exit_text(code)} after {now - service.started_at:.1f} s; "
                    f"restarting it in {delay:.1f} s ({n} of {self.give_up_exits - 1} restarts allowed within "
                    f"{self.give_up_window_s:.0f} s). See {log}")
        return None

    def _restart(self, service: Service) -> None:
        service.restart_at = None
        try:
            service.start(self.env(), self.log_dir)
        except OSError as exc:  # counted as one more exit: the next poll finds the old process still gone
            self.console.print(f"[red]✗[/red] {service.name} could not be started: {exc}")
            return
        service.restarts += 1
        self._record_pids()
        with contextlib.suppress(OSError):
            self.write_status(self.demo_info)
        self.console.print(f"[green]↻[/green] {service.name} restarted (pid {service.proc.pid}, "
                           f"restart {service.restarts})")


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _start_time(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2:].split()[19])


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def check(resp: httpx.Response) -> dict:
    if resp.status_code >= 400:
        raise RuntimeError(f"{resp.request.method} {resp.request.url}: {resp.status_code} {resp.text[:500]}")
    return resp.json() if resp.content else {}


def retire_fleet(settings, local_cloud_dir: Path) -> int:
    """Stop every local "VM" (agent process groups; their engines die with them) and mark their
    nodes terminated through the one transition function. Used at shutdown, and at start for
    whatever a crashed earlier run left behind. Returns how many nodes were retired."""
    from sqlalchemy import or_, select

    from controlplane.db.engine import session_scope
    from controlplane.fleet.nodes import transition
    from controlplane.models import Node, NodeState, Operation, OperationState, Replica, ReplicaState
    from infra.local import LocalProvider

    if local_cloud_dir.exists():
        provider = LocalProvider(local_cloud_dir, stop_grace=8.0)
        with provider._locked() as data:  # the registry is the local cloud's own inventory
            live = [(r["region"], r["instance_id"]) for r in data["instances"].values() if r["state"] != "terminated"]
        threads = [threading.Thread(target=provider.terminate, args=inst) for inst in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    retired = 0
    with session_scope(settings) as session:
        nodes = session.scalars(select(Node).where(or_(Node.cloud == "local", Node.cloud.is_(None)),
                                                   Node.state.not_in([NodeState.terminated]))).all()
        for node in nodes:
            if node.state != NodeState.failed:
                transition(session, node, NodeState.terminating, reason="embedded platform stopped")
            transition(session, node, NodeState.terminated, reason="embedded platform stopped")
            retired += 1
        ids = [n.id for n in nodes]
        if ids:
            for replica in session.scalars(select(Replica).where(Replica.node_id.in_(ids))):
                replica.state = ReplicaState.stopped
            for op in session.scalars(select(Operation).where(
                    Operation.node_id.in_(ids), Operation.state.in_([OperationState.pending, OperationState.running]))):
                op.state, op.error = OperationState.failed, "embedded platform stopped"
    return retired


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controlplane.embedded", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", type=Path, default=Path(os.environ.get("NIMBUS_STATE_DIR", ".nimbus")))
    p.add_argument("--api-port", type=int, default=int(os.environ.get("NIMBUS_EMBEDDED_API_PORT", 8000)))
    p.add_argument("--edge-port", type=int, default=int(os.environ.get("NIMBUS_EMBEDDED_EDGE_PORT", 8080)))
    p.add_argument("--database-url", default=os.environ.get("NIMBUS_DATABASE_URL"))
    p.add_argument("--no-demo", action="store_true", help="start the platform without seeding the demo")
    p.add_argument("--status-file", type=Path, help="write URLs, tokens and the demo key here (JSON) once ready")
    args = p.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        stop.set()
        raise KeyboardInterrupt

    platform = Platform(state_dir=args.state_dir, api_port=free_port(args.api_port),
                        edge_port=free_port(args.edge_port), database_url=args.database_url,
                        demo=not args.no_demo, status_file=args.status_file)
    os.environ.update({"NIMBUS_STATE_DIR": str(platform.state_dir)})
    # Installed explicitly: a shell starting us in the background (`make run &`) leaves SIGINT ignored.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        platform.console.print(f"[bold]Nimbus[/bold] embedded platform, state in {platform.state_dir}")
        platform.start()
        demo = None
        if platform.demo:
            demo = platform.seed_demo()
            platform.start_beat()
            for pool_id in demo["pool_ids"].split(","):
                platform.wait_replicas(pool_id, DEMO_REPLICAS)
            platform.show_gpu_map()
            platform.wait_edge_serves(demo["api_key"], demo["model"])
            platform.print_usage(demo)
        else:
            platform.step("platform ready (no demo seeded)")
        platform.write_status(demo)
        code = 1 if platform.supervise(stop) is not None else 0
    except KeyboardInterrupt:
        platform.console.print("\nstopping…")
    except (RuntimeError, TimeoutError) as exc:
        platform.console.print(f"[red]✗[/red] {exc}")
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        platform.stop()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
