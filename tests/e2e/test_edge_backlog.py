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

from tests.e2e.seed import ok, wait
from tests.e2e.test_autoscaling import pool_view, two_slot_warm_pool

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

    # The scale-up that sized the pool for the burst's backlog. The engines' own queues are empty
    # (the edge holds the excess), so only the edge queue can show it: 14 waiting / 2 slots is
    # far above the ceiling. Ticks that ran before the edge had published the whole burst (its
    # users start one by one) may have stepped up already, on full batch slots or a part of the
    # queue: at most two such steps, not the one-replica-per-cold-start walk.
    def scale_ups() -> list[dict]:
        return [d for d in reversed(decisions()) if d["action"] == "scale_up" and d["current_replicas"] >= 1]

    def sized_for_backlog() -> list[dict] | None:
        ups = scale_ups()
        n = next((k for k, d in enumerate(ups) if d["target_replicas"] == MAX_REPLICAS), None)
        return None if n is None else ups[:n + 1]

    *earlier, up = wait(sized_for_backlog, 60, "a scale-up to the ceiling")
    assert (up["signals"].get("edge_queue") or 0) > 0, (up, earlier)
    assert any("edge queue" in r for r in up["reasons"]), (up, earlier)
    assert len(earlier) <= 2, earlier
    wait(lambda: pool_view(platform, pool["id"])["replicas_by_state"].get("ready", 0) == MAX_REPLICAS, 90,
         "every replica the decision asked for ready")
    for t in users:
        t.join(180)
    assert errors == [] and len(results) == 16 and all(results)
