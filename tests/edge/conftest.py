"""Fixtures for the edge tests: simulator fleets (the real SGLang-compatible simulator), edge
subprocesses, a private redis-server, and a control-plane stand-in (a loopback HTTP server that
serves a snapshot JSON; the real control plane is built elsewhere)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis as redis_sync

from bench.edge.private_redis import PrivateRedis
from dataplane.edge.process import EdgeProcess
from dataplane.edge.standalone import key_sha256
from dataplane.sim.process import free_port, sim_fleet

SIM_ARGS = ["--time-scale", "20"]
SHARED_REDIS = "redis://127.0.0.1:6379/0"


def make_key(tag: str) -> str:
    return f"nmb_{tag[:8]:0<8}_{uuid.uuid4().hex}"


def standalone_config(replica_urls: list[str], tenants: list[dict[str, Any]], *, model: str = "demo",
                      served: str = "demo", settings: dict[str, Any] | None = None,
                      context_length: int = 8192) -> dict[str, Any]:
    return {
        "settings": settings or {},
        "models": [{"name": model, "default_tier": "bf16", "tiers": [
            {"tier": "bf16", "served_model_name": served, "context_length": context_length,
             "replicas": [{"url": u, "max_running_requests": 32} for u in replica_urls]},
        ]}],
        "tenants": tenants,
    }


def add_tier(cfg: dict[str, Any], tier: str, replica_url: str, *, served: str = "demo",
             context_length: int = 8192) -> dict[str, Any]:
    """Another quantization tier of the config's first model, served by one replica."""
    cfg["models"][0]["tiers"].append({"tier": tier, "served_model_name": served, "context_length": context_length,
                                      "replicas": [{"url": replica_url, "max_running_requests": 32}]})
    return cfg


@contextlib.contextmanager
def module_edge(cfg: dict[str, Any], tmp_path_factory: Any, name: str) -> Iterator[EdgeProcess]:
    """A standalone edge (no Redis) for one test module's fixture, stopped when the module is done."""
    state = tmp_path_factory.mktemp(name)
    proc = EdgeProcess(cfg, state_dir=state, redis_url="none", log_path=state / "edge.log").start()
    try:
        yield proc
    finally:
        proc.close()


def sdk_client(edge: EdgeProcess, key: str, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=edge.url + "/v1", api_key=key, max_retries=0, timeout=timeout)


def metric(edge: EdgeProcess, name: str) -> float:
    """The sum of an edge's /metrics samples whose line starts with ``name`` (labels included)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in httpx.get(edge.url + "/metrics").text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@pytest.fixture(scope="session")
def sims() -> Iterator[list]:
    """Two healthy simulator replicas shared by tests that do not hurt them."""
    with sim_fleet(2, served_model_name="demo", extra_args=SIM_ARGS, ready_delay=0.0) as fleet:
        yield fleet


@pytest.fixture
def usage_stream() -> Iterator[str]:
    """A private stream name on the shared Redis (tests never share keys)."""
    name = f"test:edge:usage:{uuid.uuid4().hex}"
    yield name
    redis_sync.Redis.from_url(SHARED_REDIS).delete(name)


@pytest.fixture
def edge_factory(tmp_path: Path):
    """Start edges; every one started is stopped at teardown."""
    started: list[EdgeProcess] = []

    def start(config: dict[str, Any] | None = None, **kw: Any) -> EdgeProcess:
        kw.setdefault("state_dir", tmp_path / f"edge{len(started)}")
        kw.setdefault("log_path", tmp_path / f"edge{len(started)}.log")
        edge = EdgeProcess(config, **kw)
        started.append(edge)
        return edge.start()

    yield start
    for edge in started:
        edge.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp_path / "redis").start()
    yield r
    r.stop()


class ControlPlaneStandIn:
    """Stand-in for the control plane's edge API (snapshot with ETags, activation), on loopback."""

    def __init__(self, snapshot: dict[str, Any], token: str = "edge-token") -> None:
        self.token = token
        self.snapshot = snapshot
        self.activations: list[dict[str, Any]] = []
        self.port = free_port()
        self.on_activate = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_snapshot(self, snapshot: dict[str, Any]) -> None:
        snapshot = dict(snapshot)
        snapshot["etag"] = uuid.uuid4().hex
        self.snapshot = snapshot

    def start(self) -> ControlPlaneStandIn:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def _auth(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {stand_in.token}":
                    self.send_response(401)
                    self.end_headers()
                    return False
                return True

            def do_GET(self) -> None:
                if self.path != "/internal/v1/edge/snapshot" or not self._auth():
                    return
                etag = stand_in.snapshot["etag"]
                if self.headers.get("If-None-Match") == etag:
                    self.send_response(304)
                    self.end_headers()
                    return
                body = json.dumps(stand_in.snapshot).encode()
                self.send_response(200)
                self.send_header("ETag", etag)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                if self.path != "/internal/v1/edge/activate" or not self._auth():
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                stand_in.activations.append(body)
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                if stand_in.on_activate:
                    stand_in.on_activate(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def cp_snapshot(replica_urls: list[str], keys: list[str], *, pool_kind: str = "warm",
                limits: dict[str, Any] | None = None) -> dict[str, Any]:
    """A control-plane-shaped snapshot with one tenant, its keys and one model served by the replicas."""
    tenant_id, variant_id, pool_id = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    return {
        "etag": uuid.uuid4().hex, "generated_at": "2026-01-01T00:00:00Z",
        "tenants": [{"id": tenant_id, "name": "acme", "status": "active", "weight": 1.0,
                     "limits": {"requests_per_minute": None, "tokens_per_minute": None,
                                "max_concurrent_requests": None, "monthly_token_budget": None,
                                "monthly_tokens_used": 0, **(limits or {})},
                     "response_cache": False}],
        "keys": [{"id": str(uuid.uuid4()), "tenant_id": tenant_id, "prefix": k.rpartition("_")[0],
                  "sha256": key_sha256(k), "scopes": ["inference"], "expires_at": None,
                  "priority": "interactive"} for k in keys],
        "models": [{"name": "demo", "default_tier": "bf16", "variants": [
            {"id": variant_id, "tier": "bf16", "context_length": 8192, "served_model_name": "demo"}]}],
        "pools": [{"id": pool_id, "variant_id": variant_id, "kind": pool_kind, "dedicated_tenant_id": None}],
        "replicas": [{"id": str(uuid.uuid4()), "pool_id": pool_id, "variant_id": variant_id,
                      "region": "local/a", "url": u, "state": "ready", "max_running_requests": 32,
                      "max_total_tokens": 100000, "metrics": {}} for u in replica_urls],
        "regions": [{"name": "local/a", "rtt_ms": 0.2}],
    }


@pytest.fixture
def control_plane() -> Iterator:
    made: list[ControlPlaneStandIn] = []

    def make(snapshot: dict[str, Any]) -> ControlPlaneStandIn:
        cp = ControlPlaneStandIn(snapshot).start()
        made.append(cp)
        return cp

    yield make
    for cp in made:
        cp.stop()


def port_is_closed() -> int:
    """A loopback port where nothing listens."""
    port = free_port()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return port
