"""End to end on a fresh database: an admin creates a pool → the local provider's agents bring up
simulator replicas → a tenant streams tokens through the edge with the openai SDK → the usage
API shows them. Then an engine is killed (the agent restarts it) and a node is drained (its
in-flight requests complete, new ones go elsewhere, none is lost).

The module's catalog has only a 1-GPU local shape, so the pool's two 1-GPU replicas land on two
nodes (with the full local catalog they would share one sim-2gpu node): draining one node leaves
the other serving while the fleet tick places the drained replica again on a new node."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from dataplane.agent import scrape
from tests.e2e.conftest import Running
from tests.e2e.seed import LLAMA_8B, local_pool, ok, one_gpu_catalog, tenant_key, wait, wait_ready

pytestmark = pytest.mark.slow
# At teardown: the services (API, worker, beat, edge, Redis) and two nodes, each an agent with one
# engine (the node that kept serving and the drained replica's replacement; the drained node's agent
# has exited): 5 + 2 × 2.
PLATFORM_MIN_PROCESSES = 9


@pytest.fixture(scope="module")
def tenant_pool(platform: Running) -> dict:
    """Seeded through the admin API only: catalog (1-GPU shape only), tenant + key, a two-tier model,
    a 2-replica pool on two nodes."""
    with platform.admin as api:
        ok(api.post("/catalog/import", json=one_gpu_catalog()))
        key = tenant_key(api, "acme", ("inference", "manage"))
        model = ok(api.post("/models", json={"name": "llama-e2e", "default_tier": "bf16", "variants": [
            LLAMA_8B, {"tier": "fp8", "model_path": "meta-llama/Llama-3.1-8B-Instruct-FP8", "gpu_memory_gb": 12,
                       "context_length": 8192, "quantization": "fp8"}]}))
        bf16 = next(v for v in model["variants"] if v["tier"] == "bf16")
        pool = local_pool(api, "llama-e2e-bf16", bf16["id"], min_replicas=2, max_replicas=2)
        wait_ready(api, pool["id"], 2, 60, "two replicas ready through the local provider")
        ready = [r for r in ok(api.get("/replicas", params={"pool_id": pool["id"]}))["items"] if r["state"] == "ready"]
        assert len({r["node_id"] for r in ready}) == 2, f"one replica per 1-GPU node: {ready}"
    return {"key": key, "pool_id": pool["id"], "model": "llama-e2e"}


def sdk(platform: Running, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.edge_url + "/v1", api_key=key, max_retries=0, timeout=60)


def agents(platform: Running) -> list[dict]:
    """Every live agent's /status (the local cloud keeps each agent's URL in its instance dir)."""
    out = []
    for url_file in (platform.state_dir / "local-cloud" / "instances").glob("*/agent-state/agent.url"):
        try:
            out.append(httpx.get(url_file.read_text().strip() + "/status", timeout=2).json())
        except httpx.HTTPError:
            continue  # a stopped agent
    return out


def ready_replicas(platform: Running, pool_id: str) -> list[dict]:
    with platform.admin as api:
        return [r for r in ok(api.get("/replicas", params={"pool_id": pool_id, "limit": 50}))["items"]
                if r["state"] == "ready"]


def test_pool_to_streamed_tokens_to_usage(platform: Running, tenant_pool: dict):
    client = sdk(platform, tenant_pool["key"])
    pieces, usage = [], None
    stream = client.chat.completions.create(
        model=tenant_pool["model"], stream=True, max_tokens=24, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Tell me about clouds."}])
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens > 0 and "".join(pieces).strip()
    replicas = ready_replicas(platform, tenant_pool["pool_id"])
    assert all(r["model_ready_seconds"] and set(r["ready_breakdown"]) == {"download", "load", "warmup"}
               for r in replicas)

    started = time.monotonic()
    tenant_api = httpx.Client(base_url=platform.api_url, headers={"Authorization": f"Bearer {tenant_pool['key']}"})

    def counted() -> dict | None:
        total = ok(tenant_api.get("/v1/tenant/usage", params={"granularity": "total"}))["total"]
        return total if total["completion_tokens"] >= usage.completion_tokens else None

    total = wait(counted, 30, "the tenant's usage to show the streamed tokens", poll=0.5)
    assert time.monotonic() - started < 30
    assert total["requests"] >= 1 and total["prompt_tokens"] >= usage.prompt_tokens


def test_killed_engine_is_restarted_and_node_health_shows_it(platform: Running, tenant_pool: dict):
    status = agents(platform)[0]
    victim = status["replicas"][0]
    os.kill(victim["pid"], signal.SIGKILL)
    with platform.admin as api:
        node = wait(lambda: (n := ok(api.get(f"/nodes/{status['node_id']}")))["metrics"].get("health", {}).get(
            "restarts") == 1 and n, 30, "the node's health to show the restart")
        assert node["metrics"]["health"]["last_restart"]["replica_id"] == victim["id"]
    wait(lambda: len(ready_replicas(platform, tenant_pool["pool_id"])) >= 2, 30, "the replica back in service")
    # …and it serves again.
    reply = sdk(platform, tenant_pool["key"]).chat.completions.create(
        model=tenant_pool["model"], max_tokens=4, messages=[{"role": "user", "content": "again"}])
    assert reply.choices[0].message.content


def _requests_served(url: str) -> float:
    return scrape.parse(httpx.get(url + "/metrics", timeout=5).text).counters.get("num_requests", 0.0)


def test_drain_finishes_in_flight_and_sends_new_work_elsewhere(platform: Running, tenant_pool: dict):
    client = sdk(platform, tenant_pool["key"])
    live = [a for a in agents(platform) if not a["draining"] and a["replicas"] and
            a["replicas"][0]["state"] == "ready"]
    assert len(live) >= 2

    def long_stream(i: int) -> tuple[str | None, int]:
        finish, tokens = None, 0
        for chunk in client.chat.completions.create(
                model=tenant_pool["model"], stream=True, max_tokens=5000, extra_body={"ignore_eos": True},
                stream_options={"include_usage": True}, messages=[{"role": "user", "content": f"long answer {i}"}]):
            if chunk.choices:
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return finish, tokens

    with ThreadPoolExecutor(6) as pool:
        in_flight = [pool.submit(long_stream, i) for i in range(6)]

        def busy() -> list[dict]:
            now = [httpx.get(a["agent_url"] + "/status").json() for a in live]
            return sorted(now, key=lambda a: -a["node_metrics"]["in_flight"]) if any(
                a["node_metrics"]["in_flight"] for a in now) else []

        drained, kept = wait(busy, 10, "streams running")[:2]  # drain the node that is serving streams
        assert drained["node_metrics"]["in_flight"] > 0
        with platform.admin as api:
            assert api.post(f"/nodes/{drained['node_id']}/drain", json={"deadline_s": 60}).status_code == 202
        results = [f.result(timeout=120) for f in in_flight]
    assert results == [("length", 5000)] * 6  # every in-flight stream finished whole

    # The pool keeps its size: the fleet tick placed the draining node's replica again, on a new node
    # (the other node's only GPU is taken). New work goes to the replicas that are not draining, and
    # every request is answered.
    def elsewhere() -> list[dict]:
        found = [r for r in ready_replicas(platform, tenant_pool["pool_id"]) if r["node_id"] != drained["node_id"]]
        return found if len(found) >= 2 else []

    serving = wait(elsewhere, 40, "a replacement replica")
    others = [r["url"] for r in serving]
    assert kept["replicas"][0]["url"] in others
    assert len({r["node_id"] for r in serving} - {kept["node_id"]}) == 1, f"the replacement on a new node: {serving}"
    # The engines count the edge's /health_generate probes as requests too (one-token
    # generations on its own schedule), so the replicas that are not draining served at least
    # the 5, not exactly 5.
    before = sum(_requests_served(u) for u in others)
    for i in range(5):
        reply = client.chat.completions.create(model=tenant_pool["model"], max_tokens=4,
                                               messages=[{"role": "user", "content": f"after drain {i}"}])
        assert reply.choices[0].message.content
    assert sum(_requests_served(u) for u in others) - before >= 5
    with platform.admin as api:
        wait(lambda: ok(api.get(f"/nodes/{drained['node_id']}"))["state"] in ("draining", "terminating",
                                                                              "terminated"), 10, "node draining")
        reps = ok(api.get("/replicas", params={"node_id": drained["node_id"]}))["items"]
        wait(lambda: all(r["state"] == "stopped" for r in
                         ok(api.get("/replicas", params={"node_id": drained["node_id"]}))["items"]), 30,
             f"the drained node's replicas to stop: {reps}")
    logs = "".join(p.read_text() for p in Path(platform.state_dir, "local-cloud", "instances").glob("*/agent.log"))
    assert '"msg": "drained"' in logs
    assert all(json.loads(line).get("in_flight", 0) == 0 for line in logs.splitlines()
               if '"msg": "drained"' in line)
