"""A stand-in for the control plane's agent API that speaks the replica-list contract
(``replicas[]`` with ids, GPU indices and ``desired_state`` in every register/resume/heartbeat
answer), so the agent's reconciliation can be tested against real agent processes and real
simulator engines.

It was written as a stand-in until the real control plane (``controlplane/services/agents.py``)
spoke this contract; it now does, and the tests against it live in ``test_agent_process.py`` and
``test_agent_api.py``. The stand-in stays for what the real one only does through its fleet loop:
a test sets the node's list directly (any GPU indices, a malformed entry, a stop with a chosen
deadline) and reads back every state the agent reported, per replica id. It is not a model of
the control plane's rules (which states it stores, when it stops listing a replica).

It is a real HTTP server (uvicorn on a free loopback port, a bare ASGI app).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.live_server import read_body, send_json, serve

BASE = "/internal/v1/agents"


def entry(gpu_ids: list[int], *, rid: str | None = None, desired: str = "running", name: str = "tiny-bf16",
          **extra: Any) -> dict:
    """One ``replicas[]`` entry as the contract has it (plus a field the agent must ignore)."""
    return {"id": rid or str(uuid.uuid4()), "pool_id": "pool-1", "variant_id": "variant-1", "model": "tiny",
            "tier": "bf16", "served_model_name": name, "model_path": "Qwen/Qwen2.5-0.5B-Instruct",
            "quantization": None, "context_length": 4096, "engine_args": {}, "gpu_ids": gpu_ids, "port": None,
            "desired_state": desired, "drain_deadline_s": 30.0, "artifact_source": None,
            "a_field_from_the_future": {"ignored": True}, **extra}


class StandInControlPlane:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.lock = threading.Lock()
        self.replicas: list[Any] = []  # what the node should run (the answers' ``replicas``)
        self.commands: list[dict] = []
        self.node_state = "booting"
        self.history: dict[str, list[str]] = {}  # replica id → its reported states, changes only
        self.latest: dict[str, dict] = {}  # replica id → its last report
        self.last_batch: list[str] = []  # the ids the last report carried
        self.heartbeats = 0
        self.registered = 0
        self.node_metrics: dict = {}  # the last heartbeat's

    # -- the test's side -------------------------------------------------------------------
    def set_replicas(self, replicas: list[Any]) -> None:
        with self.lock:
            self.replicas = list(replicas)

    def states(self, rid: str) -> list[str]:
        with self.lock:
            return list(self.history.get(rid, []))

    def state(self, rid: str) -> str | None:
        with self.lock:
            return self.latest.get(rid, {}).get("state")

    def report(self, rid: str) -> dict:
        with self.lock:
            return dict(self.latest[rid])

    def wait(self, predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = predicate()
            if got:
                return got
            if time.monotonic() > deadline:
                with self.lock:
                    raise AssertionError(f"{what} not reached in {timeout}s; reports: {self.history}")
            time.sleep(0.05)

    # -- the agent's side ------------------------------------------------------------------
    def _record(self, reports: list[dict]) -> None:
        with self.lock:
            self.last_batch = [r["id"] for r in reports]
            for r in reports:
                self.latest[r["id"]] = r
                seen = self.history.setdefault(r["id"], [])
                if not seen or seen[-1] != r["state"]:
                    seen.append(r["state"])

    def _answer(self) -> dict:
        with self.lock:
            return {"node_id": self.node_id, "node_state": self.node_state, "heartbeat_interval_s": None,
                    "commands": list(self.commands), "replicas": list(self.replicas), "unknown_top_level": 1}

    def handle(self, path: str, body: dict) -> tuple[int, dict]:
        if path == BASE + "/register":
            with self.lock:
                self.registered += 1
            return 200, {"credential": "stand-in-credential", **self._answer()}
        if path == BASE + "/resume":
            return 200, self._answer()
        if path == BASE + "/replicas":
            self._record(body.get("replicas", []))
            return 200, {"applied": len(body.get("replicas", []))}
        if path == BASE + "/heartbeat":
            self._record(body.get("replicas", []))
            with self.lock:
                self.heartbeats += 1
                self.node_metrics = body.get("node_metrics") or {}
                if body.get("draining") and self.node_state != "terminating":
                    self.node_state = "draining"
            return 200, self._answer()
        return 404, {"detail": "not found"}

    async def __call__(self, scope, receive, send) -> None:
        raw = await read_body(receive)
        if scope["path"] == "/healthz":
            status, answer = 200, {"ok": True}
        else:
            status, answer = self.handle(scope["path"], json.loads(raw or b"{}"))
        await send_json(send, status, json.dumps(answer).encode())


@contextmanager
def stand_in(node_id: str | None = None) -> Iterator[tuple[StandInControlPlane, str]]:
    cp = StandInControlPlane(node_id or str(uuid.uuid4()))
    with serve(cp, lifespan="off") as url:
        yield cp, url
