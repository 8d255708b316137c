"""Endpoints and their shapes (CONFORMANCE.md §1): what the agent, the edge and the autoscaler read."""

from __future__ import annotations

import itertools
import json

import httpx

from tests.conformance.conftest import Engine, prompt_ids


def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def test_models_list_and_retrieve(engine: Engine, client: httpx.Client):
    listing = client.get("/v1/models").json()
    card = listing["data"][0]
    assert listing["object"] == "list" and card["object"] == "model" and card["owned_by"] == "sglang"
    assert card["id"] == card["root"] == engine.model and card["max_model_len"] > 0
    one = client.get(f"/v1/models/{engine.model}")
    assert one.status_code == 200 and one.json()["id"] == engine.model
    missing = client.get("/v1/models/no-such-model-here")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_model_info_and_its_alias(client: httpx.Client):
    info = client.get("/get_model_info").json()
    assert info["is_generation"] is True and info["model_path"]
    assert client.get("/model_info").json()["model_path"] == info["model_path"]


def test_server_info_reports_capacity_where_the_agent_reads_it(engine: Engine, client: httpx.Client):
    info = client.get("/get_server_info").json()
    # The agent reads max_total_num_tokens (top level, from the scheduler) and the running cap (the
    # server arg when given, else internal_states[0].effective_max_running_requests_per_dp).
    assert info["max_total_num_tokens"] > 0
    assert engine.max_running > 0
    assert isinstance(info["internal_states"], list) and info["internal_states"]
    assert "last_gen_throughput" in info["internal_states"][0]
    assert info["model_path"] and info["tp_size"] >= 1 and info["version"]
    assert client.get("/server_info").json()["max_total_num_tokens"] == info["max_total_num_tokens"]


def test_get_load_has_one_entry_per_dp_rank(client: httpx.Client):
    load = client.get("/get_load").json()
    assert isinstance(load, list) and load
    for entry in load:
        assert {"num_reqs", "num_waiting_reqs", "num_tokens"} <= set(entry)
        assert entry["num_reqs"] >= entry["num_waiting_reqs"] >= 0 and entry["num_tokens"] >= 0


def test_health_endpoints_and_ping_answer_200_when_serving(client: httpx.Client):
    assert client.get("/health").status_code == 200
    assert client.get("/health_generate").status_code == 200
    assert client.get("/ping").status_code == 200


def test_generate_returns_text_and_meta_info(client: httpx.Client):
    ids = prompt_ids(40)
    r = client.post("/generate", json={"input_ids": ids, "rid": "conformance-one",
                                       "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    body = r.json()
    meta = body["meta_info"]
    assert isinstance(body["text"], str)
    assert meta["id"] == "conformance-one"
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 8
    assert meta["finish_reason"]["type"] == "length" and meta["finish_reason"]["length"] == 8
    assert meta["cached_tokens"] >= 0 and meta["e2e_latency"] > 0


def test_generate_batch_keeps_order_and_rids(client: httpx.Client):
    r = client.post("/generate", json={"input_ids": [prompt_ids(20), prompt_ids(30)], "rid": ["b-1", "b-2"],
                                       "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [o["meta_info"]["id"] for o in out] == ["b-1", "b-2"]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [20, 30]


def test_generate_stream_sends_cumulative_text_and_done(client: httpx.Client):
    body = {"input_ids": prompt_ids(30), "stream": True, "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
    with client.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2
    texts = [c["text"] for c in chunks]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[-1]["meta_info"]["completion_tokens"] == 6


def test_completions_shape(engine: Engine, client: httpx.Client):
    r = client.post("/v1/completions", json={"model": engine.model, "prompt": prompt_ids(25), "max_tokens": 5,
                                             "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["id"]
    assert body["choices"][0]["finish_reason"] == "length" and isinstance(body["choices"][0]["text"], str)
    usage = body["usage"]
    assert usage["prompt_tokens"] == 25 and usage["completion_tokens"] == 5 and usage["total_tokens"] == 30


def test_chat_stream_opens_with_the_role_and_ends_with_a_usage_chunk(engine: Engine, client: httpx.Client):
    body = {"model": engine.model, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 5,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_priority_is_accepted_on_both_apis(engine: Engine, client: httpx.Client):
    # Without --enable-priority-scheduling (and --abort-on-priority-when-disabled) SGLang ignores it.
    r = client.post("/generate", json={"input_ids": prompt_ids(10), "priority": 5,
                                       "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    r = client.post("/v1/completions", json={"model": engine.model, "prompt": prompt_ids(10), "max_tokens": 2,
                                             "priority": 5})
    assert r.status_code == 200, r.text


def test_long_prompt_is_prefilled_in_chunks_and_completes(engine: Engine, client: httpx.Client):
    # --chunked-prefill-size: a prompt longer than one chunk is split across extend steps; from
    # outside that is only visible as "it works" (prompt_tokens exact, nothing cached, one answer).
    chunk = engine.chunked_prefill_size or 2048
    n = min(int(chunk * 2.5), engine.context_length - 16, engine.capacity // 2)
    r = client.post("/generate", json={"input_ids": prompt_ids(n), "sampling_params": {"max_new_tokens": 2,
                                                                                       "ignore_eos": True}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["prompt_tokens"] == n and r.json()["meta_info"]["completion_tokens"] == 2
