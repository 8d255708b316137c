"""A burst the engines never see, end to end: the edge caps each replica at its batch slots and
queues the rest, so the engines report no queue at all. The edges publish their queue (Redis),
the autoscaler reads it, and the pool grows in one decision to the size the backlog needs, not
one replica per cold start. The stored decision cites the edge queue; no request is lost.
"""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from tests.e2e.test_autoscaling import pool_view, two_slot_warm_pool
from tests.e2e.test_platform import ok, wait

pytestmark = pytest.mark.slow
PLATFORM_ENV = {"NIMBUS_EDGE_SIGNALS_INTERVAL_S": "1"}
PLATFORM_MIN_PROCESSES = 7  # services, and the grown pool's agents and engines
MAX_REPLICAS = 5


def test_edge_backlog_grows_the_pool_in_one_decision(platform) -> None:
    key, pool, first = two_slot_warm_pool(platform, "burst-llama")
    with platform.admin as api:
        ok(api.patch(f"/pools/{pool['id']}", json={"max_replicas": MAX_REPLICAS}))
    # Slow the one engine down so the burst's streams stay in flight; its two batch slots bind.
    assert httpx.post(first["url"] + "/_sim/faults", json={"slowdown": 30}, timeout=5).status_code == 200
    client = openai.OpenAI(base_url=platform.edge_url + "/v1", api_key=key, max_retries=0, timeout=180)
    results: list[str] = []
    errors: list[BaseException] = []

    def user(i: int) -> None:
        try:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="burst-llama", max_tokens=24, stream=True, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": f"burst {i}"}]) if c.choices)
            results.append(text)
        except BaseException as exc:  # every failure is reported below
            errors.append(exc)

    users = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(16)]
    for t in users:
        t.start()

    def decisions() -> list[dict]:
        with platform.admin as api:
            return ok(api.get(f"/pools/{pool['id']}/decisions"))["items"]

    # The scale-up that saw the burst's backlog. The engines' own queues are empty (the edge
    # holds the excess), so only the edge queue can show it. A tick that ran before the edge
    # published may already have stepped up on the engines' full batch slots: that step is
    # allowed, but it must not be the one-replica-per-cold-start walk (counted below).
    def edge_scale_up() -> dict | None:
        return next((d for d in reversed(decisions()) if d["action"] == "scale_up"
                     and d["current_replicas"] >= 1 and (d["signals"].get("edge_queue") or 0) > 0), None)

    up = wait(edge_scale_up, 60, "a scale-up decision that saw the edge queue")
    assert any("edge queue" in r for r in up["reasons"]), up["reasons"]
    earlier = [d for d in decisions() if d["action"] == "scale_up" and d["current_replicas"] >= 1
               and d["created_at"] < up["created_at"]]
    assert len(earlier) <= 1, earlier
    # One decision sizes the pool for the whole backlog: 14 waiting / 2 slots ≫ the ceiling.
    assert up["target_replicas"] == MAX_REPLICAS, up
    wait(lambda: pool_view(platform, pool["id"])["replicas_by_state"].get("ready", 0) == MAX_REPLICAS, 90,
         "every replica the decision asked for ready")
    for t in users:
        t.join(180)
    assert errors == [] and len(results) == 16 and all(results)
