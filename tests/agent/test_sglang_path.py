"""The agent's real-engine path (``--engine sglang``) end to end on a CPU machine.

Two test doubles make it run here (``tests/agent/sglang_standin/``): an ``nvidia-smi`` that lists
four GPUs, so the agent picks SGLang, and a stand-in ``sglang.launch_server`` that records its
command line and environment, rejects flags SGLang's parser does not define, and serves through
the simulator. Everything else is the real thing: the agent process, its command template, its
readiness gating (``/health`` then ``/health_generate``), its ``/metrics`` scraping with SGLang's
metric names, and its drain. The control plane is the contract's stand-in (``standin.py``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from dataplane.agent.process import AgentProcess
from infra.bootstrap import AgentConfig
from tests.agent.conftest import FAST_AGENT_ENV
from tests.agent.sglang_standin.sglang.launch_server import SGLANG_FLAGS, check
from tests.agent.standin import entry, stand_in

STANDIN = Path(__file__).parent / "sglang_standin"


def sglang_config(url: str, node_id: str) -> AgentConfig:
    return AgentConfig(control_plane_url=url, node_id=node_id, bootstrap_token="one-time",
                       bootstrap_token_expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10),
                       variant="tiny:bf16", engine="sglang", cloud="local", region="local", zone="local-a")


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def flag_value(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_stand_in_refuses_what_sglangs_parser_would():
    assert check(["--model-path", "m", "--tp-size", "2", "--enable-metrics"]) is None
    assert "unrecognized" in check(["--model-path", "m", "--tensor-parallel"])
    assert "expected one argument" in check(["--model-path", "m", "--port"])
    assert "invalid choice" in check(["--model-path", "m", "--schedule-policy", "fastest"])
    assert "required" in check(["--tp-size", "1"])


@pytest.fixture
def sglang_node(tmp_path):
    record = tmp_path / "launches.jsonl"
    env = {key: value for key, value in FAST_AGENT_ENV.items() if key != "NIMBUS_AGENT_SIM_ARGS"}
    env |= {
        "PATH": f"{STANDIN / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(STANDIN),
        "NIMBUS_STANDIN_GPUS": "0,1,2,3",
        "NIMBUS_SGLANG_STANDIN_RECORD": str(record),
        # The stand-in's engine loads for 1 s: long enough to see the agent hold the replica back.
        "NIMBUS_SGLANG_STANDIN_SIM_ARGS": "--time-scale 2 --ready-delay 1.0",
    }
    with stand_in() as (cp, url):
        agent = AgentProcess(sglang_config(url, cp.node_id), tmp_path / "node", env=env)
        try:
            yield cp, agent, record
        finally:
            agent.stop()


def test_engine_sglang_runs_end_to_end_through_the_stand_in(sglang_node):
    cp, agent, record = sglang_node
    e = entry([1, 2], name="tiny-sglang")
    cp.set_replicas([e])
    agent.start().wait_url()
    rid = e["id"]

    # -- command line and environment -------------------------------------------------------
    cp.wait(lambda: records(record), timeout=30, what="the stand-in launched")
    launch = records(record)[0]
    argv = launch["argv"]
    assert launch["module"] == "sglang.launch_server"
    assert launch["env"]["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert flag_value(argv, "--model-path") == e["model_path"]
    assert flag_value(argv, "--served-model-name") == "tiny-sglang"
    assert flag_value(argv, "--tp-size") == "2" and flag_value(argv, "--context-length") == "4096"
    assert flag_value(argv, "--schedule-policy") == "lpm"
    assert "--enable-metrics" in argv and "--enable-cache-report" in argv
    assert not any(a.startswith(("--time-scale", "--ready-delay", "--gpu-ids")) for a in argv), argv
    assert all(a in SGLANG_FLAGS for a in argv if a.startswith("--")), argv

    # -- readiness gating: not ready while the engine loads, ready once /health_generate passes --
    cp.wait(lambda: cp.state(rid) == "starting", timeout=20, what="starting reported")
    cp.wait(lambda: cp.state(rid) == "ready", timeout=30, what="ready reported")
    assert cp.states(rid) == ["starting", "ready"]
    report = cp.report(rid)
    assert report["ready_breakdown"]["load"] + report["ready_breakdown"]["warmup"] >= 0.9
    url = report["url"]
    assert int(url.rsplit(":", 1)[1]) == int(flag_value(argv, "--port"))
    assert httpx.get(url + "/health_generate", timeout=10).status_code == 200
    # Capacity read the way SGLang reports it: the running cap from internal_states (the
    # --max-running-requests arg was not given), the KV pool from max_total_num_tokens.
    info = httpx.get(url + "/get_server_info", timeout=10).json()
    assert info["max_running_requests"] is None
    assert report["max_running_requests"] == info["internal_states"][0]["effective_max_running_requests_per_dp"] > 0
    assert report["max_total_tokens"] == info["max_total_num_tokens"] > 0
    status = agent.status()
    assert status["node_metrics"]["engine"] == "sglang" and status["node_metrics"]["gpus"] == [0, 1, 2, 3]

    # -- metrics scraping with SGLang's names ------------------------------------------------
    for _ in range(3):
        r = httpx.post(url + "/v1/completions", json={"model": "tiny-sglang", "prompt": "hello there",
                                                      "max_tokens": 5, "ignore_eos": True}, timeout=30)
        assert r.status_code == 200
    cp.wait(lambda: cp.report(rid)["metrics"].get("generation_tokens_delta", 0) > 0, timeout=15,
            what="a heartbeat with the requests' tokens")
    metrics = cp.report(rid)["metrics"]
    for gauge in ("num_running_reqs", "num_queue_reqs", "token_usage", "max_total_num_tokens"):
        assert gauge in metrics, metrics
    assert metrics["max_total_num_tokens"] == info["max_total_num_tokens"]
    assert "time_to_first_token_seconds" in metrics["histograms"]

    # -- drain: in-flight work finishes, the engine stops, the replica is reported stopped ----
    results: list = []
    first = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", url + "/generate", timeout=60, json={
                "text": "a long answer", "stream": True,
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}) as resp:
            lines = []
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    first.set()
        results.append(lines)

    t = threading.Thread(target=stream)
    t.start()
    assert first.wait(20)
    cp.set_replicas([])
    cp.wait(lambda: cp.states(rid)[-1:] == ["stopped"], timeout=40, what="stopped after the drain")
    t.join(30)
    assert cp.states(rid) == ["starting", "ready", "draining", "stopped"]
    lines = results[0]
    assert lines[-1] == "[DONE]" and json.loads(lines[-2])["meta_info"]["finish_reason"]["type"] == "length"
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/health", timeout=2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the engine process is gone, not just unreachable
        try:
            os.kill(launch["pid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"engine pid {launch['pid']} still alive after the drain")
