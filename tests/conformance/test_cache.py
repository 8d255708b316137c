"""Prefix-cache reporting and ``/flush_cache`` (CONFORMANCE.md §5, §6): the edge corrects its prefix
index from ``cached_tokens``; an idle engine flushes, a busy one refuses (see test_load.py)."""

from __future__ import annotations

import httpx

from tests.conformance.conftest import Engine, idle, prompt_ids


def generate(client: httpx.Client, ids: list[int]) -> dict:
    r = client.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def test_a_shared_prefix_is_reported_as_cached_natively_and_in_the_counter(engine: Engine, client: httpx.Client):
    prefix = prompt_ids(600)
    first = generate(client, prefix + prompt_ids(20))
    before = engine.metrics().value("sglang:cached_tokens")
    second = generate(client, prefix + prompt_ids(20))
    assert first["cached_tokens"] < 100
    # Page-aligned engines may cache slightly less than the whole prefix.
    assert second["cached_tokens"] >= 0.8 * len(prefix)
    assert second["cached_tokens"] < second["prompt_tokens"]
    assert engine.metrics().value("sglang:cached_tokens") - before == second["cached_tokens"]


def test_openai_usage_carries_cached_tokens(engine: Engine, client: httpx.Client):
    # SGLang writes usage.prompt_tokens_details only when launched with --enable-cache-report (the
    # agent always passes it) and only when some tokens were cached; the edge reads it.
    prefix = prompt_ids(500)
    body = {"model": engine.model, "max_tokens": 2, "ignore_eos": True}
    client.post("/v1/completions", json={**body, "prompt": prefix + prompt_ids(10)}).raise_for_status()
    usage = client.post("/v1/completions", json={**body, "prompt": prefix + prompt_ids(10)}).json()["usage"]
    details = usage.get("prompt_tokens_details")
    assert details and details["cached_tokens"] >= 0.8 * len(prefix), (
        f"no cached tokens in usage ({usage}): was the engine launched with --enable-cache-report?")


def test_flush_cache_on_an_idle_engine_empties_the_prefix_cache(engine: Engine, client: httpx.Client):
    prefix = prompt_ids(400)
    generate(client, prefix + prompt_ids(5))
    assert generate(client, prefix + prompt_ids(5))["cached_tokens"] >= 0.8 * len(prefix)
    idle(engine)
    r = client.post("/flush_cache")
    assert r.status_code == 200 and r.text.startswith("Cache flushed")
    assert generate(client, prefix + prompt_ids(5))["cached_tokens"] < 0.2 * len(prefix)
