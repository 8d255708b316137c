"""The real agent process reconciling the control plane's replica list, with real simulator
engines: replicas on explicit GPU indices (``CUDA_VISIBLE_DEVICES``, reported back by the
simulator), one replica drained while the others serve, in-flight work finished before a stop,
GPUs still held making a new replica wait, an empty node that keeps heartbeating, and a node drain.

The control plane is the contract's stand-in (``tests/agent/standin.py``), which lets a test set
the node's list directly; ``test_agent_process.py`` runs the agent against the real one."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time

import httpx
import pytest

from dataplane.agent import artifacts
from dataplane.agent.agent import NodeAgent, sim_args
from dataplane.agent.client import ControlPlaneClient
from dataplane.agent.config import AgentOptions
from dataplane.agent.process import AgentProcess
from dataplane.agent.replicas import ReplicaEntry
from infra.bootstrap import AgentConfig
from tests.agent.conftest import FAST_AGENT_ENV
from tests.agent.standin import StandInControlPlane, entry, stand_in


def config_for(url: str, node_id: str) -> AgentConfig:
    return AgentConfig(control_plane_url=url, node_id=node_id, bootstrap_token="one-time",
                       bootstrap_token_expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10),
                       variant="tiny:bf16", engine="sim", cloud="local", region="local", zone="local-a")


# Engines 2× faster than real time, not 20×: a 1500-token stream takes ~3 s, long enough to be
# caught in flight by a stop that arrives with the next heartbeat answer.
SLOW_SIM = {**FAST_AGENT_ENV, "NIMBUS_AGENT_SIM_ARGS": "--time-scale 2 --ready-delay 0.2"}


@pytest.fixture
def node(request, tmp_path):
    """(stand-in control plane, agent process) for a fresh node; the agent is stopped afterwards.
    ``@pytest.mark.parametrize("node", [SLOW_SIM], indirect=True)`` picks the agent's environment."""
    env = getattr(request, "param", FAST_AGENT_ENV)
    with stand_in() as (cp, url):
        agent = AgentProcess(config_for(url, cp.node_id), tmp_path / "node", env=env)
        try:
            yield cp, agent
        finally:
            agent.stop()


def local(agent: AgentProcess, rid: str) -> dict | None:
    return next((r for r in agent.status()["replicas"] if r["id"] == rid), None)


def server_info(url: str) -> dict:
    return httpx.get(url + "/get_server_info", timeout=10).json()


def ready(cp: StandInControlPlane, *ids: str) -> bool:
    return all(cp.state(rid) == "ready" for rid in ids)


def stream(url: str, tokens: int, out: list, first: threading.Event, model: str = "tiny-bf16") -> None:
    """One streamed completion; sets ``first`` at its first event, appends (status, last event,
    events, when it ended)."""
    chunks: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", timeout=60,
                      json={"model": model, "prompt": "count slowly", "max_tokens": tokens, "stream": True,
                            "ignore_eos": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line)
                first.set()
    out.append((r.status_code, chunks[-1] if chunks else None, len(chunks), time.monotonic()))


def in_flight(url: str, tokens: int = 1500) -> tuple[threading.Thread, list, threading.Event]:
    """A long stream on ``url``, started and past its first token."""
    results: list = []
    first = threading.Event()
    thread = threading.Thread(target=stream, args=(url, tokens, results, first))
    thread.start()
    assert first.wait(20), results
    return thread, results, first


def test_replicas_start_on_their_gpus_and_one_is_removed_while_the_other_serves(node):
    cp, agent = node
    a, b = entry([0]), entry([2, 3], name="tiny-other")
    cp.set_replicas([a, b])
    agent.start().wait_url()
    cp.wait(lambda: ready(cp, a["id"], b["id"]), what="both replicas ready")

    for e, visible in ((a, "0"), (b, "2,3")):
        mine = local(agent, e["id"])
        assert mine["env"]["CUDA_VISIBLE_DEVICES"] == visible
        info = server_info(mine["url"])
        assert info["gpu_ids"] == e["gpu_ids"] and info["tp_size"] == len(e["gpu_ids"])
        assert info["served_model_name"] == e["served_model_name"]
        report = cp.report(e["id"])
        assert report["gpu_ids"] == e["gpu_ids"] and report["slot"] == min(e["gpu_ids"])
        assert set(report["ready_breakdown"]) == {"download", "load", "warmup"}
    assert agent.status()["node_metrics"]["gpus_in_use"] == [0, 2, 3]

    b_url, b_pid = local(agent, b["id"])["url"], local(agent, b["id"])["pid"]
    cp.set_replicas([a])  # b no longer listed: it drains alone
    cp.wait(lambda: cp.states(b["id"])[-1:] == ["stopped"], timeout=20, what="b stopped")
    assert cp.states(b["id"]) == ["starting", "ready", "draining", "stopped"]
    with pytest.raises(httpx.HTTPError):
        httpx.get(b_url + "/health", timeout=2)
    # b's stop was reported and it is no longer listed: forgotten, no longer in reports.
    cp.wait(lambda: b["id"] not in cp.last_batch and local(agent, b["id"]) is None, what="b forgotten")

    # a was left alone: same engine, still ready, still serving; the node is not draining.
    mine = local(agent, a["id"])
    assert cp.states(a["id"]) == ["starting", "ready"] and mine["restarts"] == 0
    r = httpx.post(mine["url"] + "/v1/completions", json={"model": "tiny-bf16", "prompt": "hi", "max_tokens": 4},
                   timeout=30)
    assert r.status_code == 200 and not agent.status()["draining"]
    assert httpx.get(agent.url + "/health").status_code == 200
    assert b_pid != mine["pid"]


@pytest.mark.parametrize("node", [SLOW_SIM], indirect=True)
def test_a_replica_marked_stopped_finishes_its_in_flight_requests_first(node):
    cp, agent = node
    a, b = entry([0]), entry([1])
    cp.set_replicas([a, b])
    agent.start().wait_url()
    cp.wait(lambda: ready(cp, a["id"], b["id"]), what="both ready")
    thread, results, _ = in_flight(local(agent, a["id"])["url"])
    cp.set_replicas([{**a, "desired_state": "stopped", "drain_deadline_s": 60.0}, b])
    cp.wait(lambda: cp.state(a["id"]) == "draining", timeout=10, what="a draining")
    assert cp.state(a["id"]) == "draining" and thread.is_alive(), results  # still streaming
    cp.wait(lambda: cp.state(a["id"]) == "stopped", timeout=30, what="a stopped")
    stopped_at = time.monotonic()
    thread.join(30)
    status, last, n, ended = results[0]
    assert status == 200 and last == "data: [DONE]" and n > 100  # the stream finished whole
    assert ended <= stopped_at
    # Still listed as stopped: it keeps being reported stopped, and b is untouched.
    time.sleep(1.2)
    assert a["id"] in cp.last_batch and cp.state(a["id"]) == "stopped"
    assert cp.states(b["id"]) == ["starting", "ready"] and not agent.status()["draining"]


@pytest.mark.parametrize("node", [SLOW_SIM], indirect=True)
def test_an_entry_whose_gpus_are_still_held_waits_for_them(node):
    cp, agent = node
    old = entry([0, 1])
    cp.set_replicas([old])
    agent.start().wait_url()
    cp.wait(lambda: ready(cp, old["id"]), what="old ready")
    thread, results, _ = in_flight(local(agent, old["id"])["url"])
    new = entry([1, 2], name="tiny-new")
    cp.set_replicas([{**old, "desired_state": "stopped"}, new])
    cp.wait(lambda: cp.state(old["id"]) == "draining", timeout=10, what="old draining")
    time.sleep(1.0)
    assert local(agent, new["id"]) is None and new["id"] in agent.status()["waiting"]
    assert cp.state(new["id"]) is None  # not started, so not reported
    cp.wait(lambda: ready(cp, new["id"]), timeout=40, what="new ready after old stopped")
    thread.join(30)
    assert results[0][1] == "data: [DONE]"
    assert cp.states(old["id"])[-1] == "stopped"
    old_stopped, new_started = cp.report(old["id"]), cp.report(new["id"])
    assert old_stopped["state"] == "stopped" and new_started["started_at"]
    assert server_info(local(agent, new["id"])["url"])["gpu_ids"] == [1, 2]


def test_an_empty_node_heartbeats_then_starts_what_it_is_given_and_skips_bad_entries(node):
    cp, agent = node
    cp.set_replicas([])
    agent.start().wait_url()
    cp.wait(lambda: cp.heartbeats >= 3, what="heartbeats from an empty node")
    assert agent.status()["replicas"] == [] and not agent.status()["draining"]
    good = entry([1])
    cp.set_replicas([{"id": "broken", "gpu_ids": "all of them"}, 42, good])
    cp.wait(lambda: ready(cp, good["id"]), what="the good entry ready")
    assert [r["id"] for r in agent.status()["replicas"]] == [good["id"]]
    assert "malformed replica entry skipped" in agent.log()
    assert agent.proc.poll() is None


def test_node_drain_command_stops_every_replica_and_exits(node):
    cp, agent = node
    a, b = entry([0]), entry([1])
    cp.set_replicas([a, b])
    agent.start().wait_url()
    cp.wait(lambda: ready(cp, a["id"], b["id"]), what="both ready")
    with cp.lock:
        cp.commands = [{"type": "drain", "deadline_s": 20.0, "deadline_at": "2030-01-01T00:00:00Z"}]
    assert agent.proc.wait(30) == 0
    assert cp.state(a["id"]) == "stopped" and cp.state(b["id"]) == "stopped"
    assert "draining" in cp.states(a["id"])


def test_gpus_the_machine_lacks_are_reported_failed_not_started(tmp_path):
    """On a machine with real GPUs (here: the agent told it has GPUs 0-3), an entry naming GPU 6
    is refused: reported failed with the reason, no engine started, the agent carries on."""

    async def main(url: str, cp: StandInControlPlane) -> None:
        agent = NodeAgent(config_for(url, cp.node_id), AgentOptions(state_dir=tmp_path, host="127.0.0.1",
                                                                     port=0, engine_port_base=0))
        async with httpx.AsyncClient() as http:
            agent.http = http
            agent.client = ControlPlaneClient(url, http, tmp_path / "credential")
            agent.client.credential = "stand-in-credential"
            agent.gpus = [0, 1, 2, 3]
            bad = entry([6, 7])
            agent._apply_answer({"node_id": cp.node_id, "replicas": [bad]}, 1.0)
            for _ in range(100):
                if cp.state(bad["id"]) == "failed":
                    break
                await asyncio.sleep(0.05)
            report = cp.report(bad["id"])
            assert report["state"] == "failed" and "[6, 7]" in report["error"]
            assert agent.local[bad["id"]].replica.pid is None and agent.local[bad["id"]].task is None
            # Unlisted, and its failure told: forgotten.
            agent._apply_answer({"replicas": []}, 1.0)
            assert agent.local == {}

    with stand_in() as (cp, url):
        asyncio.run(main(url, cp))


def test_a_full_model_cache_drops_what_no_replica_runs_and_stops_reporting_it(tmp_path):
    """With the cache's share of the disk at (almost) nothing, each new download evicts the other
    checkpoints that no replica of the node runs: the heartbeat stops reporting them and a later
    replica fetches them again."""
    source = tmp_path / "bucket"
    for name in ("org/model-a", "org/model-b"):
        (source / name).mkdir(parents=True)
        (source / name / "config.json").write_text("{}")

    async def main() -> None:
        config = AgentConfig(control_plane_url="http://127.0.0.1:1", node_id="n", bootstrap_token="t",
                             bootstrap_token_expires_at=dt.datetime.now(dt.UTC), variant="v", engine="sim",
                             artifact_source=f"file://{source}", model_cache_dir=str(tmp_path / "models"))
        agent = NodeAgent(config, AgentOptions(state_dir=tmp_path / "state", model_cache_max_fraction=1e-15))
        a, b = (ReplicaEntry.from_dict(entry([g], model_path=m)) for g, m in ((0, "org/model-a"), (1, "org/model-b")))
        assert (await agent._fetch(a)).source == "source"
        assert set(agent.node_metrics()["artifacts"]) == {"org/model-a"}  # the one just fetched stays
        await agent._fetch(b)
        assert set(agent.node_metrics()["artifacts"]) == {"org/model-b"}
        assert artifacts.cached(tmp_path / "models") == ["org/model-b"]
        again = await agent._fetch(a)
        assert again.source == "source" and not again.on_node  # downloaded again, not found

    asyncio.run(main())


def test_replicas_of_one_model_fetch_its_artifacts_once(tmp_path, monkeypatch):
    """Two replicas of one model started together share one download from a real ``file://``
    source; a third started later finds it done (no download time of its own); another model
    is fetched on its own."""
    source = tmp_path / "bucket"
    for name in ("org/model-a", "org/model-b"):
        (source / name).mkdir(parents=True)
        (source / name / "config.json").write_text("{}")
    calls: list[str] = []
    real_fetch = artifacts.fetch

    def counting_fetch(model_path: str, **kw):
        calls.append(model_path)
        time.sleep(0.2)  # a download that takes a while: the second replica arrives during it
        return real_fetch(model_path, **kw)

    monkeypatch.setattr(artifacts, "fetch", counting_fetch)

    async def main() -> None:
        config = AgentConfig(control_plane_url="http://127.0.0.1:1", node_id="n", bootstrap_token="t",
                             bootstrap_token_expires_at=dt.datetime.now(dt.UTC), variant="v", engine="sim",
                             artifact_source=f"file://{source}", model_cache_dir=str(tmp_path / "models"))
        agent = NodeAgent(config, AgentOptions(state_dir=tmp_path / "state"))
        a, b, c, other = (ReplicaEntry.from_dict(entry([g], model_path=m)) for g, m in
                          ((0, "org/model-a"), (1, "org/model-a"), (2, "org/model-a"), (3, "org/model-b")))
        first, second = await asyncio.gather(agent._fetch(a), agent._fetch(b))
        assert first.path == second.path and first.source == "source" and first.download_s > 0
        later = await agent._fetch(c)
        assert later.path == first.path and later.download_s == 0.0
        # the simulator models the download for the first replica only, as the real engine pays it once
        assert not first.on_node and "--weights-cached" not in sim_args(("--time-scale", "2"), first)
        assert later.on_node and sim_args(("--time-scale", "2"), later) == ("--time-scale", "2", "--weights-cached")
        assert (await agent._fetch(other)).path != first.path
        assert set(agent.node_metrics()["artifacts"]) == {"org/model-a", "org/model-b"}

    asyncio.run(main())
    assert calls == ["org/model-a", "org/model-b"]
    # an agent started again on the node finds the weights on its disk, and reports them before any
    # replica of theirs starts
    assert artifacts.fetch("org/model-a", local_cache_dir=tmp_path / "models", source=f"file://{source}").on_node
    again = NodeAgent(AgentConfig(control_plane_url="http://127.0.0.1:1", node_id="n", bootstrap_token="t",
                                  bootstrap_token_expires_at=dt.datetime.now(dt.UTC), variant="v", engine="sim",
                                  model_cache_dir=str(tmp_path / "models")), AgentOptions(state_dir=tmp_path / "s2"))
    assert again.node_metrics()["artifacts"] == {}
    again.remember_cached()
    assert set(again.node_metrics()["artifacts"]) == {"org/model-a", "org/model-b"}
