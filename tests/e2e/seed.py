"""Driving a running platform through its admin API, as an operator would: ``ok`` (a call that
must succeed) and ``wait`` (a condition that must come true in time), and the seeds: a tenant's
key, a one-tier model, a pool on the local cloud. Each e2e test names only what it varies."""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import httpx

from controlplane.embedded import LOCAL_CATALOG


def one_gpu_catalog() -> dict:
    """The local cloud with its 1-GPU shape only: every 1-GPU replica gets a node of its own."""
    catalog = copy.deepcopy(LOCAL_CATALOG)
    region = catalog["clouds"][0]["regions"][0]
    region["instance_types"] = [t for t in region["instance_types"] if t["gpu_count"] == 1]
    assert region["instance_types"], "LOCAL_CATALOG has no 1-GPU shape"
    return catalog


def ok(resp: httpx.Response) -> dict:
    assert resp.status_code < 400, f"{resp.request.method} {resp.request.url}: {resp.status_code} {resp.text}"
    return resp.json() if resp.content else {}


def wait(predicate, timeout: float, what: str, poll: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(poll)


LLAMA_8B = {"tier": "bf16", "model_path": "meta-llama/Llama-3.1-8B-Instruct", "gpu_memory_gb": 20,
            "context_length": 8192}


def tenant_key(api: httpx.Client, prefix: str, scopes: tuple[str, ...] = ("inference",)) -> str:
    """A new tenant (its name unique per call) and the secret of a key of its."""
    tenant = ok(api.post("/tenants", json={"name": f"{prefix}-{uuid.uuid4().hex[:6]}"}))
    return ok(api.post(f"/tenants/{tenant['id']}/keys", json={"scopes": list(scopes)}))["secret"]


def llama_model(api: httpx.Client, name: str, **variant: Any) -> dict:
    """A model with one bf16 variant of Llama 3.1 8B; ``variant`` overrides its fields."""
    return ok(api.post("/models", json={"name": name, "default_tier": "bf16", "variants": [{**LLAMA_8B, **variant}]}))


def local_pool(api: httpx.Client, name: str, variant_id: str, **fields: Any) -> dict:
    return ok(api.post("/pools", json={"name": name, "variant_id": variant_id,
                                        "placement": [{"cloud": "local", "region": "local"}], **fields}))


def wait_ready(api: httpx.Client, pool_id: str, replicas: int, timeout: float, what: str = "") -> None:
    wait(lambda: ok(api.get(f"/pools/{pool_id}"))["replicas_by_state"].get("ready", 0) >= replicas, timeout,
         what or f"{replicas} replicas ready")
