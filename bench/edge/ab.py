"""A/B of the edge's overhead: this checkout's edge against another checkout's (e.g. a
``git worktree add /tmp/edge-before <commit>``), both in front of the same simulator replica, their
runs alternated in short bursts so that a busy, shared machine's drift hits both alike.

    .venv/bin/python -m bench.edge.ab --baseline /tmp/edge-before [--rounds 10] [--duration 2]

Per burst: the edge's CPU microseconds per request in a closed loop of ``--concurrency`` clients
(``/proc/<pid>/stat``), its requests/s, and the p50 latency at concurrency 1. Printed: the median of
each, and the median over rounds of the per-round ratio (this checkout / baseline), the figure to
read on a noisy machine. Same workload as ``bench.edge.overhead`` (one-token chat completions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.edge.common import ProcessUrl, bench_key, pct, run_async, table
from bench.edge.overhead import latency, peak
from dataplane.sim.process import SimProcess, free_port

KEY = bench_key("overhead")
HERE = Path(__file__).resolve().parents[2]


def start_edge(root: Path, sim_url: str, workdir: Path) -> tuple[subprocess.Popen, ProcessUrl]:
    cfg = {"settings": {"health_interval_s": 30}, "models": [{"name": "demo", "tiers": [
        {"tier": "bf16", "served_model_name": "demo", "context_length": 131072,
         "replicas": [{"url": sim_url, "max_running_requests": 4096}]}]}],
        "tenants": [{"name": "bench", "keys": [{"dev_key": KEY}]}]}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "edge.json").write_text(json.dumps(cfg))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-m", "dataplane.edge", "--host", "127.0.0.1", "--port", str(port),
                             "--state-dir", str(workdir), "--config", str(workdir / "edge.json"),
                             "--redis-url", "redis://127.0.0.1:6379/0"], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/ready", timeout=1) as resp:
                if resp.status == 200:
                    return proc, ProcessUrl(url, proc.pid)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError(f"edge from {root} did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, required=True, help="root of the checkout to compare against")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=200, help="sequential requests per round for the p50")
    args = ap.parse_args()
    trees = {"baseline": args.baseline.resolve(), "this": HERE}
    with tempfile.TemporaryDirectory(prefix="edge-ab-") as tmp, \
            SimProcess(served_model_name="demo", extra_args=["--jitter", "0", "--max-running-requests", "4096",
                                                             "--time-scale", "10000"], ready_delay=0.0) as sim:
        edges = {name: start_edge(root, sim.url, Path(tmp) / name) for name, root in trees.items()}
        try:
            cpu: dict[str, list[float]] = {n: [] for n in trees}
            rate: dict[str, list[float]] = {n: [] for n in trees}
            p50: dict[str, list[float]] = {n: [] for n in trees}
            for _, url in edges.values():  # warm-up
                run_async(peak(url, 1.0, args.concurrency, KEY))
            for r in range(args.rounds):
                order = list(edges) if r % 2 == 0 else list(reversed(edges))
                for name in order:
                    url = edges[name][1]
                    p50[name].append(pct(run_async(latency(url, args.requests, KEY)), 50))
                    rps, us = run_async(peak(url, args.duration, args.concurrency, KEY))
                    rate[name].append(rps)
                    cpu[name].append(us)
                print(f"round {r + 1}: " + "  ".join(f"{n} {cpu[n][-1]:.0f} us/req {rate[n][-1]:.0f} req/s "
                                                     f"p50 {p50[n][-1]:.3f} ms" for n in trees), flush=True)
        finally:
            for proc, _ in edges.values():
                proc.terminate()
                proc.wait(10)
    rows = [["edge", "CPU us/req (median)", "req/s (median)", "p50 ms (median)"]]
    for n in trees:
        rows.append([f"{n} ({trees[n]})", f"{statistics.median(cpu[n]):.1f}", f"{statistics.median(rate[n]):.0f}",
                     f"{statistics.median(p50[n]):.3f}"])
    print(table(rows))

    def ratio(d: dict[str, list[float]]) -> float:
        return statistics.median(t / b for t, b in zip(d["this"], d["baseline"], strict=True))

    print(f"\nthis/baseline, median of per-round ratios: CPU per request {ratio(cpu):.3f}x, "
          f"req/s {ratio(rate):.3f}x, p50 {ratio(p50):.3f}x")


if __name__ == "__main__":
    main()
