"""Consolidation under traffic, end to end on the embedded platform: three nodes, each a third used
by a replica of a different model, become one while a steady stream of requests runs through the
edge. Every move is make-before-break: no request fails, and no pool is ever without a ready
replica. On the node that stays, the GPU indices the simulators report never overlap.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import defaultdict

import httpx
import openai
import pytest

from controlplane.embedded import LOCAL_CATALOG
from tests.e2e.conftest import Running
from tests.e2e.seed import llama_model, local_pool, ok, tenant_key, wait

pytestmark = pytest.mark.slow
PLATFORM_ENV = {"NIMBUS_CONSOLIDATION_SETTLE_S": "4", "NIMBUS_EMPTY_NODE_TTL_S": "2"}
# At the end: the services, one agent and its three engines.
PLATFORM_MIN_PROCESSES = 9
MODELS = ("cons-a", "cons-b", "cons-c")


def three_gpu_catalog() -> dict:
    """The local cloud with one 3-GPU shape: a model of three replicas fills a node."""
    catalog = copy.deepcopy(LOCAL_CATALOG)
    region = catalog["clouds"][0]["regions"][0]
    region["instance_types"] = [{"name": "sim-3gpu", "gpu_type": "sim", "gpu_count": 3, "gpu_memory_gb": 80,
                                 "on_demand_price": 21.0, "spot_price": 8.4}]
    return catalog


def replicas(platform: Running) -> list[dict]:
    with platform.admin as api:
        return ok(api.get("/replicas", params={"limit": 200}))["items"]


def live_nodes(platform: Running) -> list[dict]:
    with platform.admin as api:
        return [n for n in ok(api.get("/nodes", params={"limit": 100}))["items"]
                if n["state"] in ("pending", "provisioning", "booting", "ready")]


def serving(platform: Running, pool_ids: dict[str, str]) -> dict[str, int]:
    """Ready replicas that take traffic, per model."""
    by_pool = defaultdict(int)
    for r in replicas(platform):
        if r["state"] == "ready" and r["desired_state"] == "running":
            by_pool[r["pool_id"]] += 1
    return {m: by_pool[p] for m, p in pool_ids.items()}


class Stream:
    """One request every ``every_s`` to each model, from a thread; every outcome is kept."""

    def __init__(self, client: openai.OpenAI, every_s: float) -> None:
        self.client, self.every_s = client, every_s
        self.ok = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            model = MODELS[i % len(MODELS)]
            i += 1
            try:
                out = "".join(c.choices[0].delta.content or "" for c in self.client.chat.completions.create(
                    model=model, max_tokens=8, stream=True, messages=[{"role": "user", "content": f"q{i}"}])
                    if c.choices)
                if out:
                    self.ok += 1
                else:
                    self.errors.append(f"{model}: empty answer")
            except Exception as exc:  # every failure counts against the test
                self.errors.append(f"{model}: {exc!r}")
            self.stop.wait(self.every_s)

    def __enter__(self) -> Stream:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(60)


def test_three_third_used_nodes_become_one_under_traffic(platform: Running) -> None:
    with platform.admin as api:
        ok(api.post("/catalog/import", json=three_gpu_catalog()))
        key = tenant_key(api, "cons")
        pool_ids: dict[str, str] = {}
        for name in MODELS:  # one after the other: each model fills a node of its own
            model = llama_model(api, name)
            pool = local_pool(api, name, model["variants"][0]["id"], min_replicas=3, max_replicas=3)
            pool_ids[name] = pool["id"]
            wait(lambda name=name: serving(platform, pool_ids)[name] == 3, 90, f"{name}: three replicas ready")
        assert len(live_nodes(platform)) == 3

    client = openai.OpenAI(base_url=platform.edge_url + "/v1", api_key=key, max_retries=0, timeout=60)
    lowest: dict[str, int] = {m: 1 for m in MODELS}
    with Stream(client, every_s=0.1) as stream:
        with platform.admin as api:
            for pool_id in pool_ids.values():  # each keeps one replica on its own node
                ok(api.patch(f"/pools/{pool_id}", json={"min_replicas": 1, "max_replicas": 1}))
        wait(lambda: serving(platform, pool_ids) == {m: 1 for m in MODELS}, 60, "one replica per model")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            now = serving(platform, pool_ids)
            lowest = {m: min(lowest[m], now[m]) for m in MODELS}
            if len(live_nodes(platform)) == 1 and now == {m: 1 for m in MODELS}:
                break
            time.sleep(0.2)
        time.sleep(2)  # traffic keeps flowing over the consolidated node
    assert len(live_nodes(platform)) == 1, live_nodes(platform)
    assert stream.errors == [], stream.errors[:5]
    assert stream.ok > 50
    assert lowest == {m: 1 for m in MODELS}, "a pool dropped below its ready floor during a move"

    [node] = live_nodes(platform)
    final = [r for r in replicas(platform) if r["state"] == "ready" and r["desired_state"] == "running"]
    assert len(final) == 3 and {r["node_id"] for r in final} == {node["id"]}
    assert sum(1 for r in final if r["replaces_id"]) == 2  # two replicas moved onto the node that stayed
    reported = [httpx.get(r["url"] + "/get_server_info", timeout=5).json()["gpu_ids"] for r in final]
    assert sorted(g for ids in reported for g in ids) == [0, 1, 2]  # the simulators' own view: no GPU twice
    assert sorted(reported) == sorted(r["gpu_ids"] for r in final)
    with platform.admin as api:
        moves = [d for p in pool_ids.values() for d in ok(api.get(f"/pools/{p}/decisions"))["items"]
                 if d["action"] == "consolidate"]
    assert len(moves) == 2 and all(d["reasons"][0].startswith("delete:") for d in moves), moves
