"""The Batch API end to end, with the real ``openai`` SDK against the embedded platform on Postgres:
files.create → batches.create → poll batches.retrieve → files.content, then cancel; bad input; a
tenant's batches invisible to another; and a batch that survives a SIGKILL of its worker with every
line answered exactly once and its usage counted once per line.

Everything here is real: the API, the Celery batch worker (its own queue), beat, the edge, Redis,
the local cloud's agent and simulator engine, the object store (embedded: a directory)."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import Running
from tests.e2e.seed import llama_model, local_pool, ok, one_gpu_catalog, tenant_key, wait, wait_ready

pytestmark = pytest.mark.slow
# A short lease, so a killed worker's batch is taken over in seconds; beat every second.
PLATFORM_ENV = {"NIMBUS_BATCH_INTERVAL_S": "1", "NIMBUS_BATCH_LEASE_S": "4", "NIMBUS_BATCH_CONCURRENCY": "8"}
PLATFORM_MIN_PROCESSES = 7  # the services (API, worker, batch worker, beat, edge), one agent and its engine
MODEL = "batch-llama"
FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def tenant(platform: Running) -> dict:
    with platform.admin as api:
        ok(api.post("/catalog/import", json=one_gpu_catalog()))
        keys = {"key": tenant_key(api, "batcher", ("inference", "manage")), "other": tenant_key(api, "stranger")}
        model = llama_model(api, MODEL)
        pool = local_pool(api, "batch-llama-bf16", model["variants"][0]["id"], min_replicas=1, max_replicas=1)
        wait_ready(api, pool["id"], 1, 90)
    # The edge knows a key once its snapshot has it (a poll, plus the API's snapshot cache).
    wait(lambda: httpx.get(platform.edge_url + "/v1/models", headers={"Authorization": f"Bearer {keys['key']}"})
         .status_code == 200, 10, "the keys in the edge's snapshot")
    return keys


def sdk(platform: Running, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.edge_url + "/v1", api_key=key, max_retries=0, timeout=60)


def chat_lines(n: int, max_tokens: int = 8, prefix: str = "q") -> list[dict]:
    return [{"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
                      "messages": [{"role": "user", "content": f"question {i}"}]}} for i in range(n)]


def upload(client: openai.OpenAI, lines: list[dict]) -> str:
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    return client.files.create(file=("input.jsonl", data), purpose="batch").id


def finished(client: openai.OpenAI, batch_id: str, timeout: float = 120):
    return wait(lambda: (b := client.batches.retrieve(batch_id)).status in FINAL and b, timeout,
                f"batch {batch_id} to finish", poll=0.5)


def records(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).content.decode().splitlines()]


def test_the_openai_batch_workflow_unchanged(platform: Running, tenant: dict) -> None:
    client = sdk(platform, tenant["key"])
    lines = chat_lines(12)
    lines[5]["body"]["max_tokens"] = -1  # one bad request: answered 400, reported in the error file
    file_id = upload(client, lines)
    assert client.files.retrieve(file_id).purpose == "batch"
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"job": "nightly"})
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
    done = finished(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (12, 11, 1)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out, err = records(client, done.output_file_id), records(client, done.error_file_id)
    assert sorted(r["custom_id"] for r in out) == sorted(f"q-{i}" for i in range(12) if i != 5)
    for r in out:
        assert r["response"]["status_code"] == 200 and r["error"] is None
        assert r["response"]["body"]["model"] == MODEL  # the name the line asked for
        assert r["response"]["body"]["usage"]["completion_tokens"] == 8
    assert [r["custom_id"] for r in err] == ["q-5"]
    assert err[0]["response"]["status_code"] == 400 and err[0]["response"]["body"]["error"]["param"] == "max_tokens"
    assert batch.id in [b.id for b in client.batches.list(limit=100)]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert client.files.delete(done.error_file_id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(done.error_file_id)

    # Usage: each line once (the tenant's own usage API), rolled up from the edge's events.
    tenant_api = httpx.Client(base_url=platform.api_url, headers={"Authorization": f"Bearer {tenant['key']}"})
    expected = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in out)
    total = wait(lambda: (t := ok(tenant_api.get("/v1/tenant/usage", params={"granularity": "total"}))["total"])[
        "completion_tokens"] >= expected and t, 30, "the batch's usage", poll=0.5)
    # 11: usage is kept per model variant, and the bad line was refused before it named one.
    assert total["completion_tokens"] == expected and total["requests"] == 11


def test_cancel_keeps_what_was_answered_and_stops_the_rest(platform: Running, tenant: dict) -> None:
    client = sdk(platform, tenant["key"])
    batch = client.batches.create(input_file_id=upload(client, chat_lines(400, max_tokens=64, prefix="c")),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    wait(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 8, 60, "some lines answered")
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = finished(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    answered = records(client, done.output_file_id)
    assert 8 <= len(answered) < 400 and done.request_counts.completed == len(answered)
    assert len({r["custom_id"] for r in answered}) == len(answered)
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: harmless
    small = finished(client, client.batches.create(input_file_id=upload(client, chat_lines(1, prefix="z")),
                                                   endpoint="/v1/chat/completions", completion_window="24h").id)
    assert small.status == "completed"
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(small.id)


def test_bad_input_gets_openai_errors_and_tenants_are_isolated(platform: Running, tenant: dict) -> None:
    client, stranger = sdk(platform, tenant["key"]), sdk(platform, tenant["other"])
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    assert exc.value.body["param"] == "purpose"
    file_id = upload(client, chat_lines(2))
    for kwargs, param in [({"endpoint": "/v1/images"}, "endpoint"), ({"completion_window": "1h"}, "completion_window"),
                          ({"input_file_id": "file-nope"}, "input_file_id")]:
        args = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **kwargs}
        error = openai.NotFoundError if param == "input_file_id" else openai.BadRequestError
        with pytest.raises(error) as exc:
            client.batches.create(**args)
        assert exc.value.body["param"] == param
    # Another tenant sees none of it.
    with pytest.raises(openai.NotFoundError):
        stranger.files.retrieve(file_id)
    with pytest.raises(openai.NotFoundError):
        stranger.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    # A file whose lines are wrong fails its batch, naming the line.
    dup = chat_lines(3)
    dup[2]["custom_id"] = dup[0]["custom_id"]
    failed = finished(client, client.batches.create(input_file_id=upload(client, dup),
                                                    endpoint="/v1/chat/completions", completion_window="24h").id)
    assert failed.status == "failed" and failed.errors.data[0].code == "duplicate_custom_id"
    assert failed.errors.data[0].line == 3
    with pytest.raises(openai.NotFoundError):
        stranger.batches.retrieve(failed.id)
    with pytest.raises(openai.AuthenticationError):
        sdk(platform, "nmb_wrong_key").batches.list()


def batch_worker_pid(platform: Running) -> int | None:
    """The platform's batch worker: the one whose Celery node name carries the runner's pid."""
    name = f"embedded-batches-{platform.proc.pid}@".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and name in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except OSError:
            continue
    return None


def test_a_batch_survives_a_sigkill_of_its_worker(platform: Running, tenant: dict) -> None:
    client = sdk(platform, tenant["key"])
    n = 800
    batch = client.batches.create(input_file_id=upload(client, chat_lines(n, max_tokens=64, prefix=f"k{uuid.uuid4().hex[:4]}")),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    wait(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 20, 90, "the batch under way", poll=0.1)
    victim = batch_worker_pid(platform)
    assert victim is not None, "no batch worker running"
    os.kill(victim, signal.SIGKILL)
    assert client.batches.retrieve(batch.id).status == "in_progress", "the batch finished before the kill"
    # The supervisor starts a new batch worker, which takes the batch over once the lease runs out.
    wait(lambda: batch_worker_pid(platform) not in (None, victim), 30, "a new batch worker")
    started = time.monotonic()
    done = finished(client, batch.id, timeout=180)
    assert done.status == "completed" and time.monotonic() - started < 180
    out = records(client, done.output_file_id)
    ids = [r["custom_id"] for r in out]
    assert len(ids) == n and len(set(ids)) == n, "every line answered exactly once"
    assert done.request_counts.completed == n and done.error_file_id is None
