"""``/metrics`` (CONFORMANCE.md §4): the names, types, label and buckets the agent's heartbeats and the
autoscaler are built from (``dataplane/agent/scrape.py``), and that the counters move."""

from __future__ import annotations

import httpx
import pytest

from dataplane.agent import scrape
from tests.conformance.conftest import Engine, prompt_ids

# SGLang's default bucket bounds (python/sglang/srt/metrics/collector.py). An operator who set
# --bucket-time-to-first-token / --bucket-inter-token-latency / --bucket-e2e-request-latency gets
# other bounds there; the agent forwards whatever bounds it finds.
BUCKETS = {
    "sglang:time_to_first_token_seconds": [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400],
    "sglang:inter_token_latency_seconds": [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035,
                                           0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0,
                                           6.0, 8.0],
    "sglang:e2e_request_latency_seconds": [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200,
                                           400, 600, 1200, 1800, 2400],
    "sglang:queue_time_seconds": [0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100,
                                  200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000,
                                  2500, 3000],
}


def test_every_family_the_agent_reads_exists_with_its_type_and_model_label(engine: Engine, client: httpx.Client):
    client.post("/generate", json={"input_ids": prompt_ids(20), "sampling_params": {"max_new_tokens": 3}})
    m = engine.metrics()
    expected = {**{f"sglang:{g}": "gauge" for g in scrape.GAUGES},
                **{f"sglang:{c}": "counter" for c in scrape.COUNTERS},
                **{f"sglang:{h}": "histogram" for h in scrape.HISTOGRAMS}}
    for name, kind in expected.items():
        fam = m.family(name)
        assert fam is not None, f"{name} missing from /metrics"
        assert fam.type == kind, (name, fam.type)
        assert fam.samples and all(s.labels.get("model_name") == engine.model for s in fam.samples), name


@pytest.mark.parametrize("name", sorted(BUCKETS))
def test_histogram_buckets_are_sglangs_defaults(engine: Engine, name: str):
    fam = engine.metrics().family(name)
    bounds = sorted({float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")} - {float("inf")})
    assert bounds == [float(b) for b in BUCKETS[name]]


def test_counters_and_histograms_move_with_a_request(engine: Engine, client: httpx.Client):
    before = scrape.parse(httpx.get(engine.url + "/metrics", headers=engine.headers).text)
    r = client.post("/generate", json={"input_ids": prompt_ids(33), "sampling_params": {"max_new_tokens": 7,
                                                                                       "ignore_eos": True}})
    assert r.status_code == 200
    after = scrape.parse(httpx.get(engine.url + "/metrics", headers=engine.headers).text)
    delta = scrape.heartbeat_metrics(after, before, 1.0)
    # Other tests do not run concurrently; health probes count in no metric (SGLang sends them
    # with log_metrics=False).
    assert delta["num_requests_delta"] == 1
    assert delta["prompt_tokens_delta"] == 33 and delta["generation_tokens_delta"] == 7
    assert delta["histograms"]["time_to_first_token_seconds"]["count"] == 1
    assert delta["histograms"]["e2e_request_latency_seconds"]["count"] == 1
    assert delta["histograms"]["inter_token_latency_seconds"]["count"] >= 1
    assert after.gauges["max_total_num_tokens"] == engine.capacity


def test_health_probes_are_not_counted_as_requests(engine: Engine, client: httpx.Client):
    before = engine.metrics().value("sglang:num_requests")
    for _ in range(3):
        assert client.get("/health_generate").status_code == 200
    assert engine.metrics().value("sglang:num_requests") == before
