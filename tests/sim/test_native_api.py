"""Raw SGLang HTTP API: /generate (stream and not) and the server's management endpoints."""

import json

import httpx

from dataplane.sim import tokenizer


def sse_events(response: httpx.Response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_generate_text(http):
    r = http.post("/generate", json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 7}})
    assert r.status_code == 200
    body = r.json()
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 7}
    assert meta["prompt_tokens"] == len(tokenizer.encode("The capital of France is"))
    assert meta["completion_tokens"] == len(body["output_ids"]) == 7
    assert meta["e2e_latency"] > 0 and isinstance(meta["id"], str)
    assert body["text"] == tokenizer.decode(body["output_ids"])


def test_generate_input_ids_and_default_max_new_tokens(http):
    r = http.post("/generate", json={"input_ids": [101, 102, 103], "sampling_params": {"ignore_eos": True}})
    meta = r.json()["meta_info"]
    assert meta["prompt_tokens"] == 3
    assert meta["completion_tokens"] == 128  # SGLang's default max_new_tokens


def test_generate_stream_sends_cumulative_text(http):
    with http.stream("POST", "/generate", json={"text": "stream", "stream": True,
                                                 "sampling_params": {"max_new_tokens": 5}}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    data = events[:-1]
    assert len(data) == 5
    texts = [e["text"] for e in data]
    assert all(texts[i + 1].startswith(texts[i]) and len(texts[i + 1]) > len(texts[i]) for i in range(4))
    assert [e["meta_info"]["finish_reason"] for e in data[:-1]] == [None] * 4
    assert data[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert data[-1]["meta_info"]["completion_tokens"] == 5


def test_generate_batch(http):
    r = http.post("/generate", json={"text": ["a", "b c"], "sampling_params": {"max_new_tokens": 2}})
    results = r.json()
    assert [x["meta_info"]["prompt_tokens"] for x in results] == [1, 2]


def test_generate_errors_shaped_like_sglang(http):
    r = http.post("/generate", json={"sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "message" in r.json()["error"]
    r = http.post("/generate", content=b"{not json")
    assert r.status_code == 400
    assert http.get("/generate").status_code == 405
    assert http.get("/no-such-path").json() == {"detail": "Not Found"}


def test_info_endpoints(http, shared_sim):
    assert http.get("/health").status_code == 200
    assert http.get("/health_generate").status_code == 200
    info = http.get("/get_model_info").json()
    assert info["is_generation"] is True and info["model_path"]
    server = http.get("/get_server_info").json()
    assert server["served_model_name"] == "sim-model"
    assert server["internal_states"][0]["max_total_num_tokens"] > 100_000
    assert http.get("/server_info").json()["tp_size"] == 1
    load = http.get("/get_load").json()
    assert set(load[0]) >= {"num_reqs", "num_waiting_reqs", "num_tokens"}


def test_metrics_use_sglang_names_types_and_label(http):
    http.post("/generate", json={"text": "metrics", "sampling_params": {"max_new_tokens": 3}})
    text = http.get("/metrics").text
    for gauge in ("num_running_reqs", "num_queue_reqs", "token_usage", "num_used_tokens", "cache_hit_rate",
                  "gen_throughput", "max_total_num_tokens"):
        assert f"# TYPE sglang:{gauge} gauge" in text
        assert f'sglang:{gauge}{{model_name="sim-model"}}' in text
    for counter in ("prompt_tokens", "generation_tokens", "cached_tokens", "num_requests"):
        assert f"# TYPE sglang:{counter}_total counter" in text
    for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "queue_time_seconds"):
        assert f"# TYPE sglang:{hist} histogram" in text
        assert f'sglang:{hist}_bucket{{model_name="sim-model",le="+Inf"}}' in text
    generated = next(line for line in text.splitlines() if line.startswith("sglang:generation_tokens_total"))
    assert float(generated.split()[-1]) >= 3


def test_metrics_absent_without_flag(start_sim):
    sim = start_sim("--time-scale", "50")
    assert httpx.get(sim.url + "/metrics").status_code == 404


def test_flush_cache_drops_prefixes(start_sim):
    sim = start_sim("--time-scale", "50")
    body = {"text": "shared prefix " * 200, "sampling_params": {"max_new_tokens": 1}}
    with httpx.Client(base_url=sim.url, timeout=30) as c:
        c.post("/generate", json=body)
        assert c.post("/generate", json=body).json()["meta_info"]["cached_tokens"] > 300
        assert c.post("/flush_cache").status_code == 200
        assert c.post("/generate", json=body).json()["meta_info"]["cached_tokens"] == 0
