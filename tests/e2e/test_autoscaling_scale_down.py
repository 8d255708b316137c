"""Falling load end to end: a warm pool that the autoscaler grew to two replicas under a burst
gives one back once the load falls to a light steady stream. The policy decides the
scale-down (a stored decision with its reasons), exactly one REPLICA drains (its in-flight
streams finish first; its agent drains that engine alone, never the node), the other keeps
serving, the node the drained replica leaves empty is terminated after the empty-node TTL, and
no request of either phase is lost."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import openai
import pytest

from controlplane.config import Settings
from controlplane.embedded import PLATFORM_ENV as EMBEDDED_ENV
from tests.e2e.conftest import Running
from tests.e2e.seed import ok, wait
from tests.e2e.test_autoscaling import pool_view, two_slot_warm_pool

pytestmark = pytest.mark.slow
# Minutes of hold and cooldown are right for production and far too long for a test: the same
# policy with short windows (the platform ticks the autoscaler every 2 s).
PLATFORM_ENV = {"NIMBUS_AUTOSCALER_OVERRIDES": json.dumps({
    "stable_window_s": 10, "panic_window_s": 4, "panic_hold_s": 6, "scale_down_hold_s": 16,
    "scale_down_cooldown_s": 16, "ttft_window_s": 10, "forecast_level_window_s": 10,
    "forecast_trend_window_s": 30})}
# The pool ends with one replica: the services (API, worker, beat, edge, Redis) plus one agent and its
# engine (the drained replica's node, emptied, is gone).
PLATFORM_MIN_PROCESSES = 7
EMPTY_NODE_TTL_S = Settings.model_fields["empty_node_ttl_s"].default  # an emptied node goes after this
DRAIN_TIMEOUT_S = float(EMBEDDED_ENV["NIMBUS_DRAIN_TIMEOUT_S"])  # a replica's drain deadline


class Load:
    """``users`` threads streaming chat completions until stopped; every request is recorded
    as (finish reason, completion tokens) or as the error it raised."""

    def __init__(self, client: openai.OpenAI, model: str, users: int, max_tokens: int, pause_s: float,
                 name: str) -> None:
        self.client, self.model, self.max_tokens, self.pause_s, self.name = client, model, max_tokens, pause_s, name
        self.stop = threading.Event()
        self.done: list[tuple[float, str | None, int]] = []  # (finished at, finish reason, tokens)
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._user, args=(i,), daemon=True) for i in range(users)]

    def _user(self, i: int) -> None:
        while not self.stop.is_set():
            try:
                finish, tokens = None, 0
                for chunk in self.client.chat.completions.create(
                        model=self.model, max_tokens=self.max_tokens, stream=True, extra_body={"ignore_eos": True},
                        stream_options={"include_usage": True},
                        messages=[{"role": "user", "content": f"{self.name} user {i} asks something"}]):
                    if chunk.choices:
                        finish = chunk.choices[0].finish_reason or finish
                    if chunk.usage:
                        tokens = chunk.usage.completion_tokens
                self.done.append((time.monotonic(), finish, tokens))
            except BaseException as exc:  # every failure is reported by the test
                self.errors.append(exc)
                return
            self.stop.wait(self.pause_s)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def completed_since(self, t: float) -> int:
        return sum(1 for at, _, _ in self.done if at > t)


def test_falling_load_drains_and_scales_a_warm_pool_down_without_losing_requests(platform: Running) -> None:
    key, pool, first = two_slot_warm_pool(platform, "fall-llama")

    def decisions() -> list[dict]:
        with platform.admin as api:
            return ok(api.get(f"/pools/{pool['id']}/decisions"))["items"]

    def replicas() -> list[dict]:
        with platform.admin as api:
            return ok(api.get("/replicas", params={"pool_id": pool["id"], "limit": 50}))["items"]

    client = openai.OpenAI(base_url=platform.edge_url + "/v1", api_key=key, max_retries=0, timeout=120)
    # The light load runs from start to end; the heavy one only until the pool has grown. Light
    # means well under one replica's worth of the capacity the policy learned from the throttled
    # replica (50-110 tok/s, depending on the machine; it only relearns from replicas at least
    # 30% busy, which the light load never makes them): ~10 tok/s.
    with Load(client, "fall-llama", users=2, max_tokens=4, pause_s=3.0, name="light") as light:
        # Rising: as in the rising-load test, a throttled GPU (every engine step 30× slower) with
        # two batch slots queues the burst, and the autoscaler's panic window adds a replica.
        assert httpx.post(first["url"] + "/_sim/faults", json={"slowdown": 30}, timeout=5).status_code == 200
        with Load(client, "fall-llama", users=16, max_tokens=32, pause_s=0, name="heavy") as heavy:
            wait(lambda: pool_view(platform, pool["id"])["desired_replicas"] == 2, 60, "autoscaler scales up")
            wait(lambda: pool_view(platform, pool["id"])["replicas_by_state"].get("ready", 0) == 2, 90,
                 "second replica ready")
        # Falling: the burst is over and the noisy neighbour gone; the light stream goes on.
        assert httpx.delete(first["url"] + "/_sim/faults", timeout=5).status_code == 200
        fell_at = time.monotonic()
        try:
            down = wait(lambda: next((d for d in decisions() if d["action"] == "scale_down"), None), 90,
                        "the autoscaler scales down")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; decisions since the scale-up: {json.dumps(decisions()[:6])}") from None
        scaled_down_after = time.monotonic() - fell_at

        def drained() -> list[dict]:
            return [r for r in replicas() if r["state"] in ("draining", "stopped")]

        (gone,) = wait(drained, 30, "a replica draining")
        # The drained replica goes draining → stopped (seen through the admin API); never back to serving.
        seen = [gone["state"]]

        def stopped() -> bool:
            state = next(r["state"] for r in replicas() if r["id"] == gone["id"])
            if state != seen[-1]:
                seen.append(state)
            return state == "stopped"

        wait(stopped, DRAIN_TIMEOUT_S + 10, "the drained replica stopped")
        assert seen in (["draining", "stopped"], ["stopped"]), seen
        # Alone on its node (no other replica holds a GPU there), the replica leaves it empty: the
        # node is released after the empty-node TTL. A node it shared keeps serving the others.
        neighbours = [r for r in replicas() if r["node_id"] == gone["node_id"] and r["id"] != gone["id"]
                      and r["state"] not in ("stopped", "failed")]
        with platform.admin as api:
            if not neighbours:
                wait(lambda: ok(api.get(f"/nodes/{gone['node_id']}"))["state"] == "terminated",
                     EMPTY_NODE_TTL_S + 40, "the emptied node terminated")
            node = ok(api.get(f"/nodes/{gone['node_id']}"))
        terminated_at = time.monotonic()
        # The survivor keeps serving the light stream after the scale-down.
        wait(lambda: light.completed_since(terminated_at) >= 4, 30, "light requests served after the scale-down")
    assert not heavy.errors and not light.errors, (heavy.errors[:3], light.errors[:3])
    assert len(heavy.done) >= 16 and len(light.done) >= 10
    # No request lost or cut short: every stream ran to its full length.
    assert {(f, n) for _, f, n in heavy.done} == {("length", 32)}
    assert {(f, n) for _, f, n in light.done} == {("length", 4)}

    assert down["current_replicas"] == 2 and down["target_replicas"] == 1, down
    assert any(r.startswith("scale down") for r in down["reasons"]), down
    ups = [d for d in decisions() if d["action"] == "scale_up"]
    assert ups and ups[0]["target_replicas"] == 2, ups
    # Exactly one replica went, told to stop by the scale-down; the other still serves.
    final = replicas()
    assert sorted(r["state"] for r in final) == ["ready", "stopped"], final
    assert [r["id"] for r in final if r["state"] == "stopped"] == [gone["id"]]
    (survivor,) = [r for r in final if r["state"] == "ready"]
    ended = next(r for r in final if r["id"] == gone["id"])
    assert (ended.get("stop_reason") or ended["metrics"].get("stop_reason")) == "scale down", ended
    assert pool_view(platform, pool["id"])["desired_replicas"] == 1
    with platform.admin as api:
        nodes = ok(api.get("/nodes", params={"pool_id": pool["id"]}))["items"]
        survivor_node = ok(api.get(f"/nodes/{survivor['node_id']}"))
    assert survivor_node["state"] == "ready", survivor_node
    assert sorted(n["state"] for n in nodes) == (["ready"] if neighbours else ["ready", "terminated"]), nodes

    # The agent drained that replica alone: its in-flight streams finished before its engine was
    # stopped, and the node itself was not drained while it held the replica.
    def agent_log(n: dict) -> list[dict]:
        path = Path(platform.state_dir, "local-cloud", "instances", n["instance_id"], "agent.log")
        return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]

    log = agent_log(node)
    mine = [e for e in log if e.get("replica") == gone["id"] and e["msg"] in (
        "draining replica", "replica drained", "replica drain deadline passed", "replica stopped")]
    assert [e["msg"] for e in mine] == ["draining replica", "replica drained", "replica stopped"], mine
    assert mine[1]["in_flight"] == 0, mine
    node_drains = [e for e in log if e["msg"] in ("draining", "drained", "drain deadline passed")]
    assert all(e["ts"] > mine[-1]["ts"] for e in node_drains), (mine, node_drains)  # only the empty node's stop
    if not neighbours:
        # The emptied node's release: its agent hears "stop" or gets the local cloud's SIGTERM.
        assert {e.get("reason") for e in node_drains if e["msg"] == "draining"} <= {"control plane stop", "SIGTERM"}, \
            node_drains
    # The survivor's agent drained nothing.
    assert not [e for e in agent_log(survivor_node) if e["msg"].startswith("draining")], agent_log(survivor_node)

    # Drained means stopped: the agent's report ends the replica, not its drain deadline; the emptied
    # node then waits out the empty-node TTL (not longer: ticks run every second), and goes.
    stamp = {e["msg"]: datetime.fromisoformat(e["ts"]) for e in mine}
    drain_s = (stamp["replica stopped"] - stamp["draining replica"]).total_seconds()
    assert drain_s < DRAIN_TIMEOUT_S, mine
    summary = f"replica draining → stopped in {drain_s:.1f} s"
    if not neighbours:
        times = {k: datetime.fromisoformat(v) for k, v in node["state_times"].items()}
        empty_s = (times["terminating"] - stamp["replica stopped"]).total_seconds()
        assert EMPTY_NODE_TTL_S - 1 <= empty_s < EMPTY_NODE_TTL_S + 10, (empty_s, node["state_times"], mine)
        summary += f"; emptied node terminating {empty_s:.1f} s later (TTL {EMPTY_NODE_TTL_S:.0f} s)"
    print(f"scale-down decided {scaled_down_after:.1f} s after the load fell: {down['reasons']} "
          f"(light load {down['signals']['token_rate']:.0f} tok/s, capacity {down['signals']['capacity_tok_s']} tok/s); "
          f"{summary}")
