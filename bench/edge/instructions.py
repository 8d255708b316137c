"""Instructions per request of an edge checkout, counted by valgrind's callgrind: a figure that does
not move with the load other processes put on a shared machine (CPU time and req/s do, by 30% and
more on a busy 2-core box), for comparing two versions of the edge's hot path.

    .venv/bin/python -m bench.edge.instructions [--tree /tmp/edge-before] [--requests 2000]

The edge of ``--tree`` (default: this checkout) runs under callgrind with instrumentation off until
it is ready and warmed up (300 requests); then ``--requests`` sequential one-token chat completions
(the ``bench.edge.overhead`` workload) go through one keep-alive connection, and the user-space
instructions the edge executed meanwhile are divided by their number. The simulator is this
checkout's, outside valgrind. Kernel work (the socket calls) is not counted, so a relative change
here overstates the change in the edge's total CPU. Set PYTHONHASHSEED for steadier counts, and
alternate the two trees' runs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.edge.common import bench_key
from dataplane.sim.process import SimProcess, free_port

KEY = bench_key("overhead")
HERE = Path(__file__).resolve().parents[2]
BODY = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1})


def count(tree: Path, requests: int, redis_url: str = "none") -> tuple[float, float]:
    """(instructions per request, seconds the measured requests took under callgrind)."""
    with SimProcess(served_model_name="demo", extra_args=["--jitter", "0", "--time-scale", "10000"],
                    ready_delay=0.0) as sim, tempfile.TemporaryDirectory(prefix="edge-callgrind-") as tmp:
        cfg = {"settings": {"health_interval_s": 30}, "models": [{"name": "demo", "tiers": [
            {"tier": "bf16", "served_model_name": "demo", "context_length": 131072,
             "replicas": [{"url": sim.url, "max_running_requests": 4096}]}]}],
            "tenants": [{"name": "bench", "keys": [{"dev_key": KEY}]}]}
        Path(tmp, "edge.json").write_text(json.dumps(cfg))
        port = free_port()
        out = Path(tmp, "callgrind.out")
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--instr-atstart=no", sys.executable,
             "-m", "dataplane.edge", "--port", str(port), "--state-dir", tmp, "--config", str(Path(tmp, "edge.json")),
             "--redis-url", redis_url, "--set", f"usage_stream=bench:instructions:{os.getpid()}"], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 600
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the edge under callgrind did not start") from None
                    time.sleep(1)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

            def send(n: int) -> None:
                for _ in range(n):
                    conn.request("POST", "/v1/chat/completions", BODY,
                                 {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
                    resp = conn.getresponse()
                    resp.read()
                    assert resp.status == 200, resp.status

            send(300)
            subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
            t0 = time.monotonic()
            send(requests)
            took = time.monotonic() - t0
            subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
            time.sleep(2)
            total = 0
            for dump in Path(tmp).glob("callgrind.out*"):
                for line in dump.read_text(errors="replace").splitlines():
                    if line.startswith(("summary:", "totals:")):
                        total = max(total, int(line.split()[1]))
            return total / requests, took
        finally:
            proc.terminate()
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:  # a loaded machine's callgrind can take longer: never leave it
                proc.kill()
                proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", type=Path, default=HERE, help="root of the checkout whose edge to measure")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--redis-url", default="none",
                    help="Redis for limits and usage (a private one: the stream is bench:instructions:<pid>)")
    args = ap.parse_args()
    per_request, took = count(args.tree.resolve(), args.requests, args.redis_url)
    print(f"{args.tree}: {per_request:,.0f} instructions per request ({args.requests} requests, "
          f"{took:.1f} s under callgrind)")


if __name__ == "__main__":
    main()
