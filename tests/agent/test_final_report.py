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


def final_report(tmp_path, monkeypatch, respond) -> tuple[list[str], list[str]]:
    """Run the agent's final report against ``respond(n)`` for the n-th request (1-based); return
    the paths requested and the reasons of any drain the agent began."""
    calls: list[str] = []
    drains: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return respond(len(calls), request)

    async def no_wait(_seconds: float) -> None:
        return None

    async def main() -> None:
        config = AgentConfig("http://cp.invalid", "node-1", "token", dt.datetime.now(dt.UTC), "demo")
        agent = NodeAgent(config, AgentOptions(state_dir=tmp_path))
        agent._begin_drain = lambda deadline_s, reason: drains.append(reason)  # it is draining already
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            agent.client = ControlPlaneClient(config.control_plane_url, http, tmp_path / "credential")
            monkeypatch.setattr(asyncio, "sleep", no_wait)
            await agent._report_final()

    asyncio.run(main())
    return calls, drains


def refused_connection(_n: int, request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def test_final_report_is_retried_until_the_control_plane_takes_it(tmp_path, monkeypatch):
    calls, _ = final_report(tmp_path, monkeypatch,
                            lambda n, req: refused_connection(n, req) if n <= 2 else httpx.Response(200, json={}))
    assert len(calls) == 3 and all(path.endswith("/replicas") for path in calls)


def test_final_report_gives_up_after_bounded_attempts(tmp_path, monkeypatch):
    calls, _ = final_report(tmp_path, monkeypatch, refused_connection)
    assert len(calls) == NodeAgent.FINAL_REPORT_ATTEMPTS


def test_a_refused_credential_is_not_retried(tmp_path, monkeypatch):
    calls, drains = final_report(tmp_path, monkeypatch, lambda n, req: httpx.Response(401, json={"detail": "revoked"}))
    assert len(calls) == 1 and drains == ["credential refused"]
