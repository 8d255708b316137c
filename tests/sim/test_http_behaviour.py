"""Behaviour visible to a client over HTTP: cache hits cut measured TTFT; the process helper contract."""

import signal
import subprocess
import sys
import time

import httpx

from dataplane.sim.process import SimProcess, sim_fleet


def measured_ttft(client: httpx.Client, text: str) -> tuple[float, int]:
    body = {"text": text, "stream": True, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    began = time.monotonic()
    first = None
    cached = -1
    with client.stream("POST", "/generate", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                first = first or time.monotonic() - began
                cached = int(line.split('"cached_tokens":')[1].split(",")[0])
    return first, cached


def test_shared_prefix_cuts_client_measured_ttft(start_sim):
    # Real time (scale 1): 16k uncached tokens on one H100 is ~0.5 s of prefill; a hit is a few ms.
    sim = start_sim("--time-scale", "1", "--jitter", "0")
    system = "You are a careful assistant who answers with citations. " * 1800
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        cold, cold_cached = measured_ttft(client, system + "First question?")
        warm, warm_cached = measured_ttft(client, system + "Second question?")
    assert cold_cached == 0 and warm_cached > 15_000
    assert warm < cold / 3


def test_sim_process_contract():
    with SimProcess(served_model_name="demo", extra_args=["--time-scale", "20"], ready_delay=0.0) as sim:
        assert sim.url == f"http://127.0.0.1:{sim.port}"
        assert httpx.get(sim.url + "/v1/models").json()["data"][0]["id"] == "demo"
        pid = sim.pid
    assert sim.proc.returncode is not None
    try:
        import os

        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive


def test_kill_is_immediate_and_fleet_gets_distinct_ports():
    with sim_fleet(2, extra_args=["--time-scale", "20"]) as sims:
        assert len({s.port for s in sims}) == 2
        sims[0].kill()
        assert sims[0].proc.returncode == -signal.SIGKILL
        assert httpx.get(sims[1].url + "/health").status_code == 200


def test_cli_accepts_unknown_sglang_flags_with_a_warning(tmp_path):
    log = tmp_path / "sim.log"
    sim = SimProcess(extra_args=["--time-scale", "20", "--attention-backend", "flashinfer", "--cuda-graph-max-bs",
                                 "256", "--trust-remote-code", "--schedule-policy", "lpm"], log_path=log)
    with sim:
        info = httpx.get(sim.url + "/get_server_info").json()
        assert info["schedule_policy"] == "lpm"
    text = log.read_text()
    assert "warning" in text and "--attention-backend flashinfer" in text


def test_cli_help_lists_sglang_and_own_flags():
    out = subprocess.run([sys.executable, "-m", "dataplane.sim", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for flag in ("--model-path", "--tp-size", "--mem-fraction-static", "--schedule-policy", "--gpu",
                 "--model-profile", "--time-scale", "--ready-delay", "--fault-crash-after-tokens"):
        assert flag in out


def test_cli_rejects_unknown_profiles_cleanly():
    out = subprocess.run([sys.executable, "-m", "dataplane.sim", "--gpu", "tpu-v9"], capture_output=True, text=True)
    assert out.returncode != 0
    assert "unknown GPU profile 'tpu-v9'" in out.stderr and "Traceback" not in out.stderr
