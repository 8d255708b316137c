"""The agent's last report ("every replica stopped") is what lets the control plane terminate a
drained node at once, and no heartbeat follows it: it must survive a few lost requests.

The control plane is stood in for by an ``httpx.MockTransport`` here: the point is a report lost on
the wire at one exact moment, which a real server cannot be made to do on cue."""

from __future__ import annotations

import asyncio
import datetime as dt

import httpx

from dataplane.agent.agent import NodeAgent
from dataplane.agent.client import ControlPlaneClient
from dataplane.agent.config import AgentOptions
from infra.bootstrap import AgentConfig


def agent_with_transport(tmp_path, handler) -> tuple[NodeAgent, httpx.AsyncClient]:
    config = AgentConfig("http://cp.invalid", "node-1", "token", dt.datetime.now(dt.UTC), "demo")
    agent = NodeAgent(config, AgentOptions(state_dir=tmp_path))
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    agent.client = ControlPlaneClient(config.control_plane_url, http, tmp_path / "credential")
    return agent, http


def test_final_report_is_retried_until_the_control_plane_takes_it(tmp_path, monkeypatch):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) <= 2:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={})

    async def main() -> None:
        agent, http = agent_with_transport(tmp_path, handler)
        monkeypatch.setattr(asyncio, "sleep", _no_wait)
        async with http:
            await agent._report_final()

    asyncio.run(main())
    assert len(calls) == 3 and all(path.endswith("/replicas") for path in calls)


def test_final_report_gives_up_after_bounded_attempts(tmp_path, monkeypatch):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ConnectError("connection refused", request=request)

    async def main() -> None:
        agent, http = agent_with_transport(tmp_path, handler)
        monkeypatch.setattr(asyncio, "sleep", _no_wait)
        async with http:
            await agent._report_final()

    asyncio.run(main())
    assert len(calls) == NodeAgent.FINAL_REPORT_ATTEMPTS


def test_a_refused_credential_is_not_retried(tmp_path, monkeypatch):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(401, json={"detail": "revoked"})

    drains = []

    async def main() -> None:
        agent, http = agent_with_transport(tmp_path, handler)
        agent._begin_drain = lambda deadline_s, reason: drains.append(reason)  # it drains already
        monkeypatch.setattr(asyncio, "sleep", _no_wait)
        async with http:
            await agent._report_final()

    asyncio.run(main())
    assert len(calls) == 1 and drains == ["credential refused"]


async def _no_wait(_seconds: float) -> None:
    return None
