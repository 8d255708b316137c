"""``make run`` supervises its services (``controlplane.embedded.Platform.supervise``): one that
exits is logged and started again with a capped backoff, and only Ctrl-C or a service that keeps
failing stops the platform.

The first two tests drive ``supervise`` with throwaway services (no platform, a second or two). The
last one runs the embedded platform with one replica and kills the edge (SIGTERM, as the report that
found it did), the API and the Celery worker (SIGKILL) in turn: each comes back, a completion through
the edge succeeds within 10 s of each kill, and the node is never touched."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from controlplane.embedded import LOCAL_CATALOG, Platform, Service
from tests.e2e.conftest import Running
from tests.e2e.seed import llama_model, local_pool, tenant_key, wait_ready

# At teardown: the five services. The node's agent and engine were started by the first worker,
# which this module kills, so they are no longer the runner's descendants (the runner still stops them).
PLATFORM_MIN_PROCESSES = 5


class Recorder:
    """A stand-in for rich's Console: the lines the supervisor prints."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str = "", *args, **kw) -> None:
        self.lines.append(str(text))


def quick_platform(tmp_path, **kw) -> Platform:
    return Platform(state_dir=tmp_path / "state", api_port=1, edge_port=2, console=Recorder(), restart_base_s=0.1,
                    restart_cap_s=0.4, **kw)


def test_a_service_that_exits_is_restarted_with_backoff_and_the_platform_keeps_running(tmp_path):
    marker = tmp_path / "ran-once"
    # Exits with 3 the first two times, then stays up (as a service that crashed and recovered).
    script = ("import pathlib, sys, time; p = pathlib.Path(sys.argv[1]); n = int(p.read_text() or 0) "
              "if p.exists() else 0; p.write_text(str(n + 1)); sys.exit(3) if n < 2 else time.sleep(60)")
    platform = quick_platform(tmp_path)
    flaky = Service("flaky", [sys.executable, "-c", script, str(marker)])
    platform.services["flaky"] = flaky
    flaky.start(platform.env(), platform.log_dir)
    stop = threading.Event()
    result: list[str | None] = []
    runner = threading.Thread(target=lambda: result.append(platform.supervise(stop, poll_s=0.02)))
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while not (flaky.restarts == 2 and flaky.alive() and marker.read_text() == "3"):
            assert time.monotonic() < deadline, platform.console.lines
            time.sleep(0.05)
        time.sleep(0.3)  # it stays up: nothing more happens
        assert flaky.restarts == 2 and runner.is_alive()
    finally:
        stop.set()
        runner.join(5)
        flaky.stop(2)
    assert result == [None]  # stopped by "Ctrl-C" (the event), not by a failure
    lines = platform.console.lines
    exits = [line for line in lines if "exited with code 3" in line]
    assert len(exits) == 2 and "restarting it in 0.1 s" in exits[0] and "restarting it in 0.2 s" in exits[1]
    assert sum("flaky restarted" in line for line in lines) == 2
    assert all("flaky.log" in line for line in exits)  # each exit names its log


def test_a_service_that_keeps_failing_stops_the_platform_with_a_clear_message(tmp_path):
    platform = quick_platform(tmp_path)
    broken = Service("broken", [sys.executable, "-c", "import sys; sys.exit(7)"])
    steady = Service("steady", [sys.executable, "-c", "import time; time.sleep(60)"])
    platform.services |= {"broken": broken, "steady": steady}
    for service in (broken, steady):
        service.start(platform.env(), platform.log_dir)
    started = time.monotonic()
    try:
        why = platform.supervise(threading.Event(), poll_s=0.02)
    finally:
        steady.stop(2)
    assert why is not None and time.monotonic() - started < 10
    assert why.startswith("broken keeps failing: it exited 5 times within 60 s (last exited with code 7)")
    assert "stopping the platform" in why and str(platform.log_dir / "broken.log") in why
    assert broken.restarts == 4 and steady.restarts == 0
    delays = [float(line.split("restarting it in ")[1].split(" s")[0]) for line in platform.console.lines
              if "restarting it in" in line]
    assert delays == [0.1, 0.2, 0.4, 0.4]  # doubling, capped


# -- the embedded platform -------------------------------------------------------------------------
def ok(resp: httpx.Response) -> dict:
    assert resp.status_code < 400, f"{resp.request.method} {resp.request.url}: {resp.status_code} {resp.text}"
    return resp.json() if resp.content else {}


def status_pids(platform: Running) -> dict[str, int]:
    return json.loads((platform.state_dir.parent / "status.json").read_text())["pids"]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


@pytest.mark.slow
def test_killed_edge_api_and_worker_come_back_and_requests_succeed_within_10_s(platform: Running):
    with platform.admin as api:
        ok(api.post("/catalog/import", json=LOCAL_CATALOG))
        key = tenant_key(api, "sup")
        model = llama_model(api, "sup-llama")
        pool = local_pool(api, "sup-llama-bf16", model["variants"][0]["id"], min_replicas=1, max_replicas=1)
        wait_ready(api, pool["id"], 1, 60)
        nodes_before = {n["id"] for n in ok(api.get("/nodes"))["items"] if n["state"] == "ready"}

    def served() -> bool:
        try:
            r = httpx.post(platform.edge_url + "/v1/chat/completions", timeout=5,
                           headers={"Authorization": f"Bearer {key}"},
                           json={"model": "sup-llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def api_up() -> bool:
        try:
            return httpx.get(platform.api_url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    deadline = time.monotonic() + 30
    while not served():  # the edge's snapshot has the replica
        assert time.monotonic() < deadline, "the edge never served the replica"
        time.sleep(0.2)

    served_again: dict[str, float] = {}  # seconds from the kill to the first completion through the edge
    back_after: dict[str, float] = {}  # seconds from the kill to the service restarted (and healthy)
    for name, sig in (("edge", signal.SIGTERM), ("api", signal.SIGKILL), ("worker", signal.SIGKILL)):
        old = status_pids(platform)[name]
        os.kill(old, sig)
        killed_at = time.monotonic()
        while name not in served_again or name not in back_after:
            elapsed = time.monotonic() - killed_at
            # 10 s for requests, as asked; the API's own restart gets longer (its imports alone take
            # 2 s of CPU, 7 s of wall time on a busy 2-core machine) while the edge serves without it.
            assert elapsed < (20 if name == "api" else 10), (name, served_again, back_after, status_pids(platform))
            new = status_pids(platform).get(name)
            restarted = new != old and alive(new) and (name != "api" or api_up())
            if restarted and name not in back_after:
                back_after[name] = round(elapsed, 1)
            if name not in served_again and (name != "edge" or restarted) and served():
                served_again[name] = round(elapsed, 1)
            time.sleep(0.1)
        assert served_again[name] < 10, (name, served_again)
    assert platform.proc.poll() is None  # the runner never stopped

    log = (platform.state_dir.parent / "runner.log").read_text()
    assert "edge exited with code 0" in log or "edge was killed by SIGTERM" in log, log[-3000:]
    assert "api was killed by SIGKILL" in log and "worker was killed by SIGKILL" in log, log[-3000:]
    assert log.count("restarting it in 0.5 s") >= 3
    with platform.admin as api:  # nothing was taken from the fleet
        nodes_after = {n["id"] for n in ok(api.get("/nodes"))["items"] if n["state"] == "ready"}
        assert nodes_after == nodes_before
    print("completions again after (s):", served_again, "services back after (s):", back_after)
