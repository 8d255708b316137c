"""The agent's backoff toward the control plane, in process: the waits (``Backoff``) and the heartbeat
loop against a control plane that refuses connections, then answers (``httpx.MockTransport``: the
point is exact timings, which a real refused port gives too but a busy machine blurs)."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import time

import httpx

from dataplane.agent.agent import NodeAgent
from dataplane.agent.backoff import Backoff
from dataplane.agent.client import ControlPlaneClient
from dataplane.agent.config import AgentOptions
from infra.bootstrap import AgentConfig


def test_waits_double_up_to_the_cap_with_equal_jitter():
    top = Backoff(1, 30, rand=lambda: 0.0)
    assert [top.next_delay() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    bottom = Backoff(1, 30, rand=lambda: 1.0)  # the most jitter takes off half
    assert [bottom.next_delay() for _ in range(7)] == [0.5, 1, 2, 4, 8, 15, 15]
    rand = Backoff(1, 30)
    waits = [rand.next_delay() for _ in range(200)]
    assert all(w1 <= w2 * 2 for w1, w2 in itertools.pairwise(waits))
    assert all(15 <= w <= 30 for w in waits[5:]) and len({round(w, 6) for w in waits[5:]}) > 100  # spread
    rand.reset()
    assert rand.next_delay() <= 1.0


def test_heartbeats_to_a_refused_control_plane_back_off_then_resume_at_the_interval(tmp_path):
    times: list[float] = []
    refused = 7
    enough = asyncio.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        times.append(time.monotonic())
        if len(times) <= refused:
            raise httpx.ConnectError("connection refused", request=request)
        if len(times) >= refused + 6:
            enough.set()
        return httpx.Response(200, json={"commands": [], "replicas": []})

    async def main() -> NodeAgent:
        config = AgentConfig("http://cp.invalid", "node-1", "token", dt.datetime.now(dt.UTC), "demo")
        agent = NodeAgent(config, AgentOptions(state_dir=tmp_path, heartbeat_s=0.02, cp_retry_base_s=0.02,
                                               cp_retry_cap_s=0.16))
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            agent.http = http
            agent.client = ControlPlaneClient(config.control_plane_url, http, tmp_path / "credential")
            loop = asyncio.create_task(agent._heartbeat_loop(0.02))
            await asyncio.wait_for(enough.wait(), 10)
            agent._done.set()
            agent._wake.set()
            await asyncio.wait_for(loop, 5)
        return agent

    agent = asyncio.run(main())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    failing, after = gaps[:refused], gaps[refused:]
    ceilings = [0.02, 0.04, 0.08, 0.16, 0.16, 0.16, 0.16]
    for gap, ceiling in zip(failing, ceilings, strict=True):
        assert 0.5 * ceiling - 0.005 <= gap <= ceiling + 0.1, (failing, ceilings)
    assert max(failing) <= 0.16 + 0.1 and failing[3] > failing[0] * 2
    assert all(gap < 0.15 for gap in after), after  # back at the 0.02 s interval: no backoff left over
    assert agent.status()["control_plane"]["reachable"] is True


def test_replica_reports_coalesce_and_wait_for_the_next_heartbeat_while_the_control_plane_is_down(tmp_path):
    posted: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        posted.append(request.url.path)
        await asyncio.sleep(0.05)  # each report in flight for a while
        return httpx.Response(200, json={"applied": 0})

    async def main() -> tuple[list[bool], list[bool]]:
        config = AgentConfig("http://cp.invalid", "node-1", "token", dt.datetime.now(dt.UTC), "demo")
        agent = NodeAgent(config, AgentOptions(state_dir=tmp_path))
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            agent.client = ControlPlaneClient(config.control_plane_url, http, tmp_path / "credential")
            # Ten state changes at once: one report in flight, one waiting (it sends the latest
            # states), the other eight ride on that one.
            up = await asyncio.gather(*(agent._report_replicas() for _ in range(10)))
            assert len(posted) == 2
            agent._control_plane_failed(httpx.ConnectError("refused"))  # heartbeats are failing
            down = await asyncio.gather(*(agent._report_replicas() for _ in range(10)))
            assert len(posted) == 2  # nothing sent on its own: the next heartbeat carries it
            assert await agent._report_replicas(force=True) and len(posted) == 3  # the drain's final one
        return up, down

    up, down = asyncio.run(main())
    assert all(up) and not any(down)


def test_a_resume_whose_answer_is_lost_is_retried_with_the_same_boot_id(tmp_path, monkeypatch):
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:
            raise httpx.ReadTimeout("no answer", request=request)
        return httpx.Response(200, json={"node_id": "node-1", "node_state": "ready", "replicas": []})

    async def main() -> dict | None:
        config = AgentConfig("http://cp.invalid", "node-1", "token", dt.datetime.now(dt.UTC), "demo")
        agent = NodeAgent(config, AgentOptions(state_dir=tmp_path, cp_retry_base_s=0.01))
        (tmp_path / "credential").write_text("node-credential")
        monkeypatch.setattr("dataplane.agent.agent.detect_gpus", list)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            agent.client = ControlPlaneClient(config.control_plane_url, http, tmp_path / "credential")
            return await agent._connect()

    answer = asyncio.run(main())
    assert answer is not None and answer["node_state"] == "ready"
    assert len(bodies) == 2 and bodies[0]["boot_id"] and bodies[0]["boot_id"] == bodies[1]["boot_id"]
