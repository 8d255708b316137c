"""Static stability end to end on the embedded platform: the control-plane API is frozen (SIGSTOP)
for far longer than the heartbeat timeout while a tenant sends 5 requests/s through the edge.

What the control plane guarantees and this test holds: the sweeper keeps judging nodes while no
heartbeat arrives, sees every node silent at once, pauses evictions (audited) instead of
terminating them, and resumes once heartbeats arrive again: no node is replaced, no replica lost.
The edge serves from its last snapshot meanwhile (≥ 99.9% of the requests succeed). The thresholds
are shrunk so the test takes well under a minute: a node is silent after 4 s without a heartbeat
(agents beat every 1 s), the sweeper runs every 2 s, the API is stopped for 15 s.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import threading
import time
import uuid

import httpx
import pytest
from sqlalchemy import create_engine, text

from controlplane.embedded import LOCAL_CATALOG
from tests.e2e.conftest import Running

pytestmark = pytest.mark.slow
PLATFORM_ENV = {"NIMBUS_HEARTBEAT_TIMEOUT_S": "4", "NIMBUS_SWEEP_INTERVAL_S": "2", "NIMBUS_AUTOSCALER_ENABLED": "false"}
# At teardown: the 5 services and the two nodes, each an agent with one engine.
PLATFORM_MIN_PROCESSES = 9
OUTAGE_S = 15.0
RATE = 5.0  # requests per second through the edge


def ok(resp: httpx.Response) -> dict:
    assert resp.status_code < 400, f"{resp.request.method} {resp.request.url}: {resp.status_code} {resp.text}"
    return resp.json() if resp.content else {}


def wait(predicate, timeout: float, what: str, poll: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        if value := predicate():
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(poll)


def nodes(platform: Running) -> dict[str, dict]:
    with platform.admin as api:
        return {n["id"]: n for n in ok(api.get("/nodes", params={"limit": 50}))["items"]}


def scope_events(database_url: str) -> list[tuple[str, str]]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT action, target_id FROM audit_events WHERE target_type = 'eviction_scope' ORDER BY at"))]
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def serving(platform: Running) -> dict:
    """A tenant key and a 2-replica pool on two 1-GPU local nodes, both ready."""
    catalog = copy.deepcopy(LOCAL_CATALOG)
    region = catalog["clouds"][0]["regions"][0]
    region["instance_types"] = [t for t in region["instance_types"] if t["gpu_count"] == 1]
    with platform.admin as api:
        ok(api.post("/catalog/import", json=catalog))
        tenant = ok(api.post("/tenants", json={"name": f"steady-{uuid.uuid4().hex[:6]}"}))
        key = ok(api.post(f"/tenants/{tenant['id']}/keys", json={"scopes": ["inference"]}))
        model = ok(api.post("/models", json={"name": "steady", "default_tier": "bf16", "variants": [
            {"tier": "bf16", "model_path": "meta-llama/Llama-3.1-8B-Instruct", "gpu_memory_gb": 20,
             "context_length": 8192}]}))
        pool = ok(api.post("/pools", json={"name": "steady-bf16", "variant_id": model["variants"][0]["id"],
                                            "placement": [{"cloud": "local", "region": "local"}],
                                            "min_replicas": 2, "max_replicas": 2}))
        wait(lambda: ok(api.get(f"/pools/{pool['id']}"))["replicas_by_state"].get("ready", 0) >= 2, 60,
             "two replicas ready")
    return {"key": key["secret"], "pool_id": pool["id"], "model": "steady"}


class Load(threading.Thread):
    """``RATE`` small chat completions per second through the edge, each on its own schedule
    slot (a slow answer does not delay the next request)."""

    def __init__(self, edge_url: str, key: str, model: str) -> None:
        super().__init__(daemon=True)
        self.url, self.model = edge_url + "/v1/chat/completions", model
        self.headers = {"Authorization": f"Bearer {key}"}
        self.stop = threading.Event()
        self.results: list[tuple[float, int | str]] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _one(self, client: httpx.Client) -> None:
        sent = time.monotonic()
        try:
            r = client.post(self.url, headers=self.headers, json={
                "model": self.model, "max_tokens": 4, "messages": [{"role": "user", "content": "ping"}]})
            outcome: int | str = r.status_code
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        with self._lock:
            self.results.append((sent, outcome))

    def run(self) -> None:
        with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=64)) as client:
            start = time.monotonic()
            n = 0
            while not self.stop.is_set():
                t = threading.Thread(target=self._one, args=(client,), daemon=True)
                t.start()
                self._threads.append(t)
                n += 1
                self.stop.wait(max(0.0, start + n / RATE - time.monotonic()))
            for t in self._threads:
                t.join(35)


def test_api_stopped_far_past_the_heartbeat_timeout_takes_no_capacity_away(
    platform: Running, serving: dict, fresh_database: str
):
    before = {i: n for i, n in nodes(platform).items() if n["state"] == "ready"}
    assert len(before) == 2
    pid = json.loads((platform.state_dir.parent / "status.json").read_text())["pids"]["api"]
    load = Load(platform.edge_url, serving["key"], serving["model"])
    load.start()
    time.sleep(3)
    stopped_at = time.monotonic()
    os.killpg(pid, signal.SIGSTOP)
    try:
        time.sleep(OUTAGE_S)  # ≈ 4 heartbeat timeouts, ≈ 7 sweeps
    finally:
        os.killpg(pid, signal.SIGCONT)
    resumed_at = time.monotonic()
    time.sleep(6)
    load.stop.set()
    load.join(60)

    outcomes = [o for _, o in load.results]
    during = [o for t, o in load.results if stopped_at <= t < resumed_at]
    failed = [o for o in outcomes if o != 200]
    print(f"\nAPI stopped {OUTAGE_S:.0f} s: {len(outcomes)} requests, {len(during)} sent while it was stopped, "
          f"{len(failed)} failed")
    assert len(during) >= RATE * OUTAGE_S * 0.8, f"too few requests sent while the API was stopped: {len(during)}"
    assert (len(outcomes) - len(failed)) / len(outcomes) >= 0.999, f"{len(failed)} of {len(outcomes)} failed: {failed[:10]}"

    # The sweeper saw every node silent and paused instead of evicting; it resumes once they report.
    events = wait(lambda: (e := scope_events(fresh_database)) and ("fleet.evictions_resumed", "fleet") in e and e,
                  30, "the sweeper to resume evictions after the heartbeats came back")
    assert ("fleet.evictions_paused", "fleet") in events and ("fleet.evictions_paused", "local/local") in events
    after = nodes(platform)
    assert {i: n["state"] for i, n in after.items()} == {i: "ready" for i in before}, "a node was replaced"
    with platform.admin as api:
        replicas = ok(api.get("/replicas", params={"pool_id": serving["pool_id"], "limit": 50}))["items"]
    assert sorted(r["node_id"] for r in replicas if r["state"] == "ready") == sorted(before)
    assert not [r for r in replicas if r["state"] in ("failed", "stopped")], "a replica was lost"
