"""SGLang's own router (PyPI ``sglang-router``) cannot tell three simulators from SGLang engines."""

import importlib.util
import subprocess
import sys
import time

import httpx
import openai
import pytest

from dataplane.sim.process import free_port, sim_fleet

ROUTER_MISSING = importlib.util.find_spec("sglang_router") is None
if ROUTER_MISSING:
    print("sglang-router is not installed (pip install sglang-router); router conformance test skipped")


def requests_served(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("sglang:num_requests_total"))
    return float(line.split()[-1])


@pytest.fixture(scope="module")
def routed_fleet(tmp_path_factory):
    # The router also tries to load a tokenizer for the model path (from disk, else from the
    # Hugging Face hub); on this loopback-only machine that fails with a warning and routing
    # works without it, as it does for real workers.
    with sim_fleet(3, served_model_name="sim-model", model_path="/models/llama-3.1-8b",
                   extra_args=["--time-scale", "50", "--enable-metrics"]) as sims:
        port = free_port()
        log = tmp_path_factory.mktemp("router") / "router.log"
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *[s.url for s in sims],
               "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(port),
               "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1"]
        with open(log, "wb") as out:
            router = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert router.poll() is None, log.read_text()[-2000:]
                time.sleep(0.1)
            yield url, sims
        finally:
            router.terminate()
            try:
                router.wait(5)
            except subprocess.TimeoutExpired:
                router.kill()


@pytest.mark.skipif(ROUTER_MISSING, reason="sglang-router could not be installed")
def test_router_registers_all_simulators_and_routes_with_affinity(routed_fleet):
    url, sims = routed_fleet
    workers = httpx.get(url + "/workers").json()["workers"]
    assert sorted(w["url"] for w in workers) == sorted(s.url for s in sims)
    assert all(w["is_healthy"] and w["model_id"] == "sim-model" for w in workers)

    before = [requests_served(s.url) for s in sims]
    shared = "You are a meticulous assistant for the Nimbus inference cloud. " * 40
    for i in range(6):
        r = httpx.post(url + "/generate", json={"text": shared + f"question {i}",
                                                "sampling_params": {"max_new_tokens": 4}}, timeout=30)
        assert r.status_code == 200
        assert r.json()["meta_info"]["completion_tokens"] == 4
    served = [requests_served(s.url) - b for s, b in zip(sims, before, strict=True)]
    assert sum(served) == 6
    assert max(served) == 6  # cache_aware keeps a shared prefix on one worker


@pytest.mark.skipif(ROUTER_MISSING, reason="sglang-router could not be installed")
def test_openai_sdk_through_router(routed_fleet):
    url, _ = routed_fleet
    with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
        resp = client.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=5)
        assert resp.usage.completion_tokens == 5
        chunks = list(client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "stream"}], max_tokens=5, stream=True,
            stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens == 5
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
