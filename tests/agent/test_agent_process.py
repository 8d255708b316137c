"""The real agent process against a real control plane: it registers with its bootstrap token,
starts the replicas placed on its node (simulator engines from the command template, on their
GPU indices), registers them once ``/health_generate`` passes, heartbeats scraped metrics,
restarts a killed engine, stops a replica the control plane stops (and starts the one placed
on its GPUs next), and drains without losing work."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import httpx
import pytest

from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import writes
from controlplane.fleet.reconcile import fleet_tick
from controlplane.models import Node, Replica
from dataplane.agent.process import AgentProcess
from tests.agent.conftest import (
    EDGE_TOKEN,
    FAST_AGENT_ENV,
    ControlPlane,
    add_replica,
    agent_config,
    make_node,
    make_pool,
)

# Engines 2× faster than real time (not 20×): a 1500-token stream takes ~3 s, so a drain really
# has in-flight work to wait for.
AGENT_ENV = {**FAST_AGENT_ENV, "NIMBUS_AGENT_SIM_ARGS": "--time-scale 2 --ready-delay 0.2"}


def replicas_of(cp: ControlPlane, node_id: str) -> list[dict]:
    return cp.get_admin(f"/admin/v1/replicas?node_id={node_id}")["items"]


def wait_cp(cp: ControlPlane, node_id: str, predicate, timeout: float = 30.0, what: str = "") -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        reps = replicas_of(cp, node_id)
        if predicate(reps):
            return reps
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached; replicas: {reps}")
        time.sleep(0.1)


def all_ready(n: int):
    return lambda reps: len(reps) == n and all(r["state"] == "ready" for r in reps)


@pytest.fixture
def started(cp: ControlPlane, tmp_path):
    """An agent on a 2-GPU node: two simulator replicas placed on GPUs 0 and 1, registered and ready."""
    pool = make_pool(cp)
    node_id, token = make_node(cp, pool, gpus=2)
    agent = AgentProcess(agent_config(cp, node_id, token), tmp_path / "node", env=AGENT_ENV).start()
    try:
        agent.wait_url()
        wait_cp(cp, node_id, all_ready(2), what="two ready replicas")
        yield cp, pool, node_id, agent
    finally:
        agent.stop()


def test_agent_registers_engines_with_ready_breakdown_and_heartbeats_metrics(started):
    cp, pool, node_id, agent = started
    reps = replicas_of(cp, node_id)
    assert sorted(tuple(r["gpu_ids"]) for r in reps) == [(0,), (1,)]
    for r in agent.status()["replicas"]:  # the control plane's ids, on the GPUs it chose
        assert r["env"]["CUDA_VISIBLE_DEVICES"] == str(r["gpu_ids"][0]) and r["slot"] == r["gpu_ids"][0]
        assert httpx.get(r["url"] + "/get_server_info").json()["gpu_ids"] == r["gpu_ids"]
    assert {r["id"] for r in agent.status()["replicas"]} == {r["id"] for r in reps}
    for r in reps:
        assert set(r["ready_breakdown"]) == {"download", "load", "warmup"}
        assert r["ready_breakdown"]["load"] >= 0.15  # the simulator's 0.2 s model load
        assert r["model_ready_seconds"] == pytest.approx(sum(r["ready_breakdown"].values()), abs=0.01)
    snap = cp.http.get(cp.url + "/internal/v1/edge/snapshot", headers={"Authorization": f"Bearer {EDGE_TOKEN}"})
    for r in snap.json()["replicas"]:  # capacities read from the engine's /get_server_info
        assert r["max_running_requests"] > 0 and r["max_total_tokens"] > 0
    assert cp.get_admin(f"/admin/v1/nodes/{node_id}")["state"] == "ready"

    # Traffic on one engine shows up in its next heartbeat (counter deltas, TTFT histogram delta).
    url = reps[0]["url"]

    def served(rs: list[dict]) -> dict:
        return next(x for x in rs if x["url"] == url)["metrics"]

    wait_cp(cp, node_id, lambda rs: "num_running_reqs" in served(rs), what="a first scrape")
    time.sleep(0.6)  # past the next scrape, so the warm-up generation is no longer in the deltas
    r = httpx.post(url + "/v1/completions", json={"model": pool.served_model_name, "prompt": "hello there",
                                                  "max_tokens": 8}, timeout=30)
    assert r.status_code == 200, r.text
    got = served(wait_cp(cp, node_id, lambda rs: served(rs).get("num_requests_delta", 0) >= 1,
                         what="metrics with the request in them"))
    assert {"num_running_reqs", "num_queue_reqs", "cache_hit_rate", "token_usage", "gen_throughput"} <= set(got)
    assert got["generation_tokens_delta"] >= 8 and got["prompt_tokens_delta"] >= 2
    assert got["histograms"]["time_to_first_token_seconds"]["count"] >= 1
    assert got["histograms"]["inter_token_latency_seconds"]["count"] >= 7
    node = cp.get_admin(f"/admin/v1/nodes/{node_id}")
    assert node["metrics"]["agent"]["replicas_ready"] == 2 and node["last_heartbeat_at"]

    # The agent's own endpoints: health, status, Prometheus metrics, JSON logs.
    assert httpx.get(agent.url + "/health").status_code == 200
    metrics = httpx.get(agent.url + "/metrics").text
    assert 'nimbus_agent_replicas{state="ready"} 2.0' in metrics
    assert 'nimbus_agent_model_ready_seconds_count{phase="load"} 2.0' in metrics
    assert '"msg": "engine ready"' in agent.log()


def test_killed_engine_is_restarted_and_the_node_health_shows_it(started):
    cp, _pool, node_id, agent = started
    victim = agent.status()["replicas"][0]
    os.kill(victim["pid"], signal.SIGKILL)

    reps = wait_cp(cp, node_id, lambda rs: all_ready(2)(rs) and any(r["restarts"] == 1 for r in rs),
                   what="the killed replica back and counted")
    back = next(r for r in reps if r["id"] == victim["id"])
    assert back["restarts"] == 1 and back["url"] == victim["url"]
    health = cp.get_admin(f"/admin/v1/nodes/{node_id}")["metrics"]["health"]
    assert health["restarts"] == 1 and health["last_restart"]["replica_id"] == victim["id"]
    assert health["last_restart"]["exit_code"] == -signal.SIGKILL
    now = next(r for r in agent.status()["replicas"] if r["id"] == victim["id"])
    assert now["pid"] != victim["pid"] and httpx.get(victim["url"] + "/health_generate", timeout=10).status_code == 200
    slot = victim["slot"]
    assert f'nimbus_agent_engine_restarts_total{{slot="{slot}"}} 1.0' in httpx.get(agent.url + "/metrics").text


def _stream(url: str, model: str, tokens: int, out: list, first: threading.Event | None = None) -> None:
    chunks: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", timeout=60,
                      json={"model": model, "prompt": "count slowly", "max_tokens": tokens, "stream": True,
                            "ignore_eos": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line)
                if first is not None:
                    first.set()
    out.append((r.status_code, chunks[-1] if chunks else None, len(chunks), time.monotonic()))


def test_sigterm_drains_in_flight_requests_then_exits(started):
    cp, pool, node_id, agent = started
    url = replicas_of(cp, node_id)[0]["url"]
    results: list = []
    # ~3 s of decoding at 2× time scale: still running when SIGTERM arrives, and past the drain grace.
    first = threading.Event()
    thread = threading.Thread(target=_stream, args=(url, pool.served_model_name, 1500, results, first))
    thread.start()
    assert first.wait(20)
    agent.terminate()
    assert agent.wait(lambda s: s["draining"], what="draining")["draining"]
    assert httpx.get(agent.url + "/health").status_code == 503
    wait_cp(cp, node_id, lambda rs: all(r["state"] == "draining" for r in rs), timeout=10, what="draining")
    # Replicas are reported draining at once; the node follows with the agent's next heartbeat.
    deadline = time.monotonic() + 10
    while cp.get_admin(f"/admin/v1/nodes/{node_id}")["state"] != "draining" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cp.get_admin(f"/admin/v1/nodes/{node_id}")["state"] == "draining"

    thread.join(60)
    assert agent.proc.wait(30) == 0
    status, last, n, _ended = results[0]
    assert status == 200 and last == "data: [DONE]" and n > 100  # the in-flight stream finished whole
    wait_cp(cp, node_id, lambda rs: all(r["state"] == "stopped" for r in rs), timeout=10, what="stopped")


def test_control_plane_drain_command_stops_the_agent(started):
    cp, _pool, node_id, agent = started
    r = cp.post(f"/admin/v1/nodes/{node_id}/drain", {"deadline_s": 30}, headers=cp.admin)
    assert r.status_code == 202
    assert agent.wait(lambda s: s["draining"], timeout=10, what="draining")
    assert agent.proc.wait(30) == 0
    assert all(r["state"] == "stopped" for r in replicas_of(cp, node_id))
    # That last report is the agent saying "drained": the next reconcile tick ends the node,
    # well before its 30 s deadline, instead of leaving an idle VM up until then.
    with session_scope(cp.settings) as session:
        fleet_tick(session, cp.settings, utcnow())
    node = cp.get_admin(f"/admin/v1/nodes/{node_id}")
    assert node["state"] == "terminating", node
    audit = cp.get_admin("/admin/v1/audit?action=node.terminating")["items"]
    assert [(a["target_id"], a["after"]["reason"]) for a in audit] == [
        (node_id, "drained: the agent reported every replica stopped")]


def test_refused_bootstrap_token_exits_with_its_own_code(cp: ControlPlane, tmp_path):
    pool = make_pool(cp)
    node_id, _token = make_node(cp, pool)
    agent = AgentProcess(agent_config(cp, node_id, "stolen-or-stale"), tmp_path / "node", env=FAST_AGENT_ENV)
    with agent:
        assert agent.proc.wait(20) == 3
    assert "control plane refused this node" in agent.log()
    assert [r["state"] for r in replicas_of(cp, node_id)] == ["pending"]  # placed, never started


def test_a_replica_the_control_plane_stops_drains_alone_and_the_next_one_takes_its_gpu(started):
    cp, pool, node_id, agent = started
    reps = replicas_of(cp, node_id)
    stop = next(r for r in reps if r["gpu_ids"] == [1])
    keep = next(r for r in reps if r["gpu_ids"] == [0])
    keep_pid = next(r["pid"] for r in agent.status()["replicas"] if r["id"] == keep["id"])
    results: list = []
    first = threading.Event()
    thread = threading.Thread(target=_stream, args=(stop["url"], pool.served_model_name, 1500, results, first))
    thread.start()
    assert first.wait(20)
    # Scale-down stops it, and placement puts a new replica on the GPU it still holds.
    with session_scope(cp.settings) as s:
        row = s.get(Replica, uuid.UUID(stop["id"]))
        writes.stop_replica(row, {row.node_id: s.get(Node, row.node_id)}, utcnow(), cp.settings, reason="test")
        new_id = add_replica(s, node_id, pool, [1])

    def by_id(rs: list[dict]) -> dict[str, dict]:
        return {r["id"]: r for r in rs}

    assert agent.wait(lambda st: any(r["id"] == stop["id"] and r["draining_alone"] for r in st["replicas"]),
                      timeout=10, what="the stopped replica draining")
    status = agent.status()
    assert new_id in status["waiting"] and new_id not in {r["id"] for r in status["replicas"]}  # GPU 1 is held
    reps = wait_cp(cp, node_id, lambda rs: by_id(rs)[stop["id"]]["state"] == "stopped", timeout=30,
                   what="the stopped replica stopped")
    stopped_at = time.monotonic()
    thread.join(30)
    status_code, last, n, ended = results[0]
    assert status_code == 200 and last == "data: [DONE]" and n > 100 and ended <= stopped_at  # finished first
    reps = wait_cp(cp, node_id, lambda rs: by_id(rs)[new_id]["state"] == "ready", timeout=30, what="new ready")
    new = next(r for r in agent.status()["replicas"] if r["id"] == new_id)
    assert new["gpu_ids"] == [1] and new["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert httpx.get(new["url"] + "/get_server_info").json()["gpu_ids"] == [1]
    # The other replica and the node were left alone; the stopped one is no longer listed, so forgotten.
    assert by_id(reps)[keep["id"]]["state"] == "ready" and by_id(reps)[keep["id"]]["restarts"] == 0
    assert next(r["pid"] for r in agent.status()["replicas"] if r["id"] == keep["id"]) == keep_pid
    assert cp.get_admin(f"/admin/v1/nodes/{node_id}")["state"] == "ready"
    assert agent.wait(lambda st: stop["id"] not in {r["id"] for r in st["replicas"]}, timeout=10, what="forgotten")
