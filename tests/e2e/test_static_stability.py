"""Static stability end to end on the embedded platform: the control-plane API is frozen (SIGSTOP)
for far longer than the heartbeat timeout while a tenant sends 5 requests/s through the edge; then
the Celery worker is frozen instead, then Postgres is made unreachable.

What the control plane guarantees and this test holds: the sweeper keeps judging nodes while no
heartbeat arrives, sees every node silent at once, pauses evictions (audited) instead of
terminating them, and resumes once heartbeats arrive again: no node is replaced, no replica lost.
The edge serves from its last snapshot meanwhile (≥ 99.9% of the requests succeed). The thresholds
are shrunk so the test takes well under a minute: a node is silent after 4 s without a heartbeat
(agents beat every 1 s), the sweeper runs every 2 s, the API is stopped for 15 s.

The worker and Postgres cases use the same platform (one start for the module) and hold the same
line: ≥ 99.9% of the requests succeed, no node is terminated or replaced, no replica is lost.
Postgres is never stopped (the shared server at 127.0.0.1:5432 serves other tests): the platform
reaches its database through ``PgProxy``, a TCP proxy started here, and the outage is the proxy's
blackhole, a network partition: open connections stall, new ones are accepted but never answered
(an unreachable host) and are cut when it ends.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.conftest import PG_ADMIN_DSN
from tests.e2e.conftest import Running
from tests.e2e.seed import llama_model, local_pool, ok, one_gpu_catalog, tenant_key, wait, wait_ready

pytestmark = pytest.mark.slow
PLATFORM_ENV = {"NIMBUS_HEARTBEAT_TIMEOUT_S": "4", "NIMBUS_SWEEP_INTERVAL_S": "2", "NIMBUS_AUTOSCALER_ENABLED": "false"}
# At teardown: the 5 services and the two nodes, each an agent with one engine.
PLATFORM_MIN_PROCESSES = 9
OUTAGE_S = 15.0
WORKER_OUTAGE_S = DB_OUTAGE_S = 10.0  # 2.5 heartbeat timeouts, 5 sweep intervals
RATE = 5.0  # requests per second through the edge


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


class PgProxy:
    """A TCP proxy to Postgres that can be made unreachable, as a network partition does it:
    ``blackhole()`` stops forwarding (open connections stall, their bytes wait as a partition's
    retransmits would) and holds new connections unanswered (connected, never a byte back);
    ``restore()`` lets the open ones flow again and cuts the held ones (their connect timed out)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.direct_url = ""  # the database's URL without the proxy (set by the fixture)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # both ends of every forwarded connection
        self._held: list[socket.socket] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self.accepted_while_blackholed = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                if not self._flowing.is_set():
                    self._held.append(client)
                    self.accepted_while_blackholed += 1
                    continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open |= {client, server}
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                self._flowing.wait(1.0)
                if not self._flowing.is_set():
                    continue
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for src in ready:
                    if not self._flowing.is_set():
                        break  # blackholed while waiting: leave the bytes where they are
                    data = src.recv(65536)
                    if not data:
                        return
                    (b if src is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            self._drop(a, b)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open.difference_update(socks)
        for sock in socks:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                sock.close()  # a reset
            except OSError:
                pass

    def blackhole(self) -> None:
        with self._lock:
            self._flowing.clear()

    def restore(self) -> None:
        with self._lock:
            self._flowing.set()
            held, self._held = self._held, []
        self._drop(*held)

    def close(self) -> None:
        self._closed.set()
        self.listener.close()
        self.restore()
        with self._lock:
            left = list(self._open)
        self._drop(*left)


@pytest.fixture(scope="module")
def pg_proxy() -> Iterator[PgProxy]:
    upstream = make_url(PG_ADMIN_DSN)
    proxy = PgProxy((upstream.host or "127.0.0.1", upstream.port or 5432))
    yield proxy
    proxy.close()


@pytest.fixture(scope="module")
def fresh_database(fresh_database: str, pg_proxy: PgProxy) -> str:
    """The platform's database URL, through the proxy (the conftest's fixture creates and drops the
    database; ``pg_proxy.direct_url`` is the way around the proxy, for the test's own reads)."""
    url = make_url(fresh_database)
    assert (url.host, url.port or 5432) == pg_proxy.upstream, f"the proxy forwards to {pg_proxy.upstream}"
    pg_proxy.direct_url = fresh_database
    return url.set(port=pg_proxy.port).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def serving(platform: Running) -> dict:
    """A tenant key and a 2-replica pool on two 1-GPU local nodes, both ready."""
    with platform.admin as api:
        ok(api.post("/catalog/import", json=one_gpu_catalog()))
        key = tenant_key(api, "steady")
        model = llama_model(api, "steady")
        pool = local_pool(api, "steady-bf16", model["variants"][0]["id"], min_replicas=2, max_replicas=2)
        wait_ready(api, pool["id"], 2, 60)
    return {"key": key, "pool_id": pool["id"], "model": "steady"}


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


def service_pid(platform: Running, name: str) -> int:
    return json.loads((platform.state_dir.parent / "status.json").read_text())["pids"][name]


def outage_under_load(platform: Running, serving: dict, outage_s: float, begin: Callable[[], None],
                      end: Callable[[], None], after_s: float = 6.0) -> tuple[list[tuple[float, int | str]], float, float]:
    """Steady load through the edge, ``begin()`` 3 s in, ``end()`` ``outage_s`` later (also on
    error), the load stopped ``after_s`` after that: (results, outage start, outage end)."""
    load = Load(platform.edge_url, serving["key"], serving["model"])
    load.start()
    try:
        time.sleep(3)
        began_at = time.monotonic()
        begin()
        try:
            time.sleep(outage_s)
        finally:
            end()
        ended_at = time.monotonic()
        time.sleep(after_s)
    finally:
        load.stop.set()
        load.join(60)
    return load.results, began_at, ended_at


def assert_served(what: str, results: list[tuple[float, int | str]], began_at: float, ended_at: float) -> None:
    outcomes = [o for _, o in results]
    during = [o for t, o in results if began_at <= t < ended_at]
    failed = [o for o in outcomes if o != 200]
    print(f"\n{what} {ended_at - began_at:.0f} s: {len(outcomes)} requests, {len(during)} sent during it, "
          f"{len(failed)} failed")
    assert len(during) >= RATE * (ended_at - began_at) * 0.8, f"too few requests sent during it: {len(during)}"
    assert (len(outcomes) - len(failed)) / len(outcomes) >= 0.999, f"{len(failed)} of {len(outcomes)} failed: {failed[:10]}"


def assert_capacity_kept(platform: Running, serving: dict, before: dict[str, dict]) -> None:
    """The same nodes, all ready (none terminated, none added in place of one), and the pool's ready
    replicas still on them, none failed or stopped."""
    after = nodes(platform)
    assert {i: n["state"] for i, n in after.items()} == {i: "ready" for i in before}, "a node was replaced"
    with platform.admin as api:
        replicas = ok(api.get("/replicas", params={"pool_id": serving["pool_id"], "limit": 50}))["items"]
    assert sorted(r["node_id"] for r in replicas if r["state"] == "ready") == sorted(before)
    assert not [r for r in replicas if r["state"] in ("failed", "stopped")], "a replica was lost"


def ready_nodes(platform: Running) -> dict[str, dict]:
    before = {i: n for i, n in nodes(platform).items() if n["state"] == "ready"}
    assert len(before) == 2, before
    return before


def last_reconciled(database_url: str, pool_id: str):
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT last_reconciled_at FROM pools WHERE id = :id"), {"id": pool_id}).scalar()
    finally:
        engine.dispose()


def latest_heartbeat(database_url: str) -> dt.datetime:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            at = conn.execute(text("SELECT max(last_heartbeat_at) FROM nodes")).scalar()
    finally:
        engine.dispose()
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def heartbeats(platform: Running) -> dict[str, str]:
    return {i: n["last_heartbeat_at"] for i, n in nodes(platform).items()}


def test_api_stopped_far_past_the_heartbeat_timeout_takes_no_capacity_away(
    platform: Running, serving: dict, fresh_database: str
):
    before = ready_nodes(platform)
    pid = service_pid(platform, "api")
    results, stopped_at, resumed_at = outage_under_load(
        platform, serving, OUTAGE_S,  # ≈ 4 heartbeat timeouts, ≈ 7 sweeps
        lambda: os.killpg(pid, signal.SIGSTOP), lambda: os.killpg(pid, signal.SIGCONT))
    assert_served("API stopped", results, stopped_at, resumed_at)

    # The sweeper saw every node silent and paused instead of evicting; it resumes once they report.
    events = wait(lambda: (e := scope_events(fresh_database)) and ("fleet.evictions_resumed", "fleet") in e and e,
                  30, "the sweeper to resume evictions after the heartbeats came back")
    assert ("fleet.evictions_paused", "fleet") in events and ("fleet.evictions_paused", "local/local") in events
    assert_capacity_kept(platform, serving, before)


def test_worker_stopped_past_the_heartbeat_timeout_takes_no_capacity_away(
    platform: Running, serving: dict, pg_proxy: PgProxy
):
    """The Celery worker frozen: no sweep, reconcile or usage roll-up runs; heartbeats still reach the
    API. On SIGCONT the beat's backlog (expiring tasks) runs against fresh heartbeats: nothing evicted."""
    before = ready_nodes(platform)
    pid = service_pid(platform, "worker")
    marks: dict[str, object] = {}
    pauses = [e for e in scope_events(pg_proxy.direct_url) if e[0] == "fleet.evictions_paused"]

    def begin() -> None:
        os.killpg(pid, signal.SIGSTOP)
        time.sleep(1.0)  # a tick under way when it stopped may still commit its stamp
        marks["stopped"] = last_reconciled(pg_proxy.direct_url, serving["pool_id"])

    def end() -> None:
        marks["before_cont"] = last_reconciled(pg_proxy.direct_url, serving["pool_id"])
        os.killpg(pid, signal.SIGCONT)

    results, stopped_at, resumed_at = outage_under_load(platform, serving, WORKER_OUTAGE_S, begin, end)
    assert marks["stopped"] == marks["before_cont"], "the worker reconciled while it was stopped"
    assert_served("worker stopped", results, stopped_at, resumed_at)
    # The worker works again (the fleet tick stamps the pool), and judged the same nodes ready.
    wait(lambda: last_reconciled(pg_proxy.direct_url, serving["pool_id"]) != marks["before_cont"], 20,
         "a fleet tick after SIGCONT")
    time.sleep(2 * float(PLATFORM_ENV["NIMBUS_SWEEP_INTERVAL_S"]))  # a sweep after the backlog
    assert_capacity_kept(platform, serving, before)
    # Heartbeats never stopped arriving: no node was even silent, so no scope paused.
    assert [e for e in scope_events(pg_proxy.direct_url) if e[0] == "fleet.evictions_paused"] == pauses


def test_postgres_unreachable_past_the_heartbeat_timeout_takes_no_capacity_away(
    platform: Running, serving: dict, pg_proxy: PgProxy
):
    """Every query of the API, worker and beat stalls and new connections hang: heartbeats cannot be
    recorded, the sweeper cannot read. The edge serves from its snapshot; afterwards heartbeats land
    again, and the sweeper, which finds every node silent at once, evicts nothing."""
    before = ready_nodes(platform)
    beats = heartbeats(platform)
    marks: dict[str, dt.datetime] = {}

    def begin() -> None:
        pg_proxy.blackhole()
        marks["cut"] = dt.datetime.now(dt.UTC)

    def end() -> None:
        marks["last_beat"] = latest_heartbeat(pg_proxy.direct_url)
        pg_proxy.restore()

    results, cut_at, restored_at = outage_under_load(platform, serving, DB_OUTAGE_S, begin, end)
    # The outage was one: no heartbeat reached the database while it lasted.
    assert marks["last_beat"] <= marks["cut"], marks
    assert_served("Postgres unreachable", results, cut_at, restored_at)
    print(f"connections held unanswered during it: {pg_proxy.accepted_while_blackholed}")
    # Heartbeats are recorded again (every node's is newer than before the outage)...
    wait(lambda: all(h and h > beats[i] for i, h in heartbeats(platform).items() if i in before), 40,
         "heartbeats recorded after the outage")
    time.sleep(2 * float(PLATFORM_ENV["NIMBUS_SWEEP_INTERVAL_S"]))  # ...and the sweeper has judged them
    print(f"eviction scope events: {scope_events(pg_proxy.direct_url)}")
    assert_capacity_kept(platform, serving, before)
