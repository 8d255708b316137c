"""How many concurrent streams one simulator process sustains on one core, on time.

    .venv/bin/python -m bench.sim.efficiency [--streams 100 200 400 800] [--tokens 128]

For each concurrency N: a fresh simulator (real time, ``--time-scale 1``, Llama-3.1-8B on an
H100, no jitter) and N OpenAI completion streams opened at once by a raw-socket asyncio client
(a heavy client would measure itself). We read:

* the simulator's **CPU time** (user + system, from ``/proc/<pid>/stat``) per streamed event
  and per scheduler step. The simulator is single-threaded, so "keeps time on one core" means
  the CPU one step costs fits inside the step's own simulated duration: ``headroom =
  model step time / CPU per step`` must stay above 1 (we call >= 1.25 sustained);
* its own account of lateness against its absolute schedule (``/_sim/stats``): share of late
  steps and the wall/scheduled stretch. These are only meaningful on an otherwise idle core;
  the load average is printed next to them because on a shared machine they measure the
  neighbours as much as the simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import httpx

from dataplane.sim.process import SimProcess


async def one_stream(port: int, tokens: int, i: int) -> int:
    body = json.dumps({"model": "m", "prompt": f"stream {i} " * 20, "max_tokens": tokens, "ignore_eos": True,
                       "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    events = 0
    tail = b""
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            break
        data = tail + chunk
        events += data.count(b"data: {") - tail.count(b"data: {")
        if b"data: [DONE]" in data:
            break
        tail = data[-16:]
    writer.close()
    return events


async def run_level(port: int, streams: int, tokens: int) -> tuple[float, int]:
    began = time.monotonic()
    counts = await asyncio.gather(*(one_stream(port, tokens, i) for i in range(streams)))
    return time.monotonic() - began, sum(counts)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(streams: int, tokens: int) -> dict:
    with SimProcess(extra_args=["--time-scale", "1", "--jitter", "0"]) as sim:
        before = cpu_seconds(sim.pid)
        load = os.getloadavg()[0]
        wall, events = asyncio.run(run_level(sim.port, streams, tokens))
        cpu = cpu_seconds(sim.pid) - before
        stats = httpx.get(sim.url + "/_sim/stats").json()
    lag = stats["lag"]
    steps = max(1, lag["steps"])
    model_step_ms = 1000 * lag["busy_s"] / steps
    cpu_step_ms = 1000 * cpu / steps
    return {
        "streams": streams,
        "events": events,
        "cpu_us_per_event": round(1e6 * cpu / max(1, events), 1),
        "cpu_ms_per_step": round(cpu_step_ms, 2),
        "model_ms_per_step": round(model_step_ms, 2),
        "headroom": round(model_step_ms / cpu_step_ms, 2) if cpu_step_ms else None,
        "late_steps_pct": round(100 * lag["late_steps"] / steps, 1),
        "mean_lag_ms": round(lag["mean_lag_ms"], 2),
        "stretch_wall_over_schedule": round(wall / lag["busy_s"], 2) if lag["busy_s"] else None,
        "load_avg_1m": round(load, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, nargs="+", default=[100, 200, 400, 800])
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    rows = [measure(n, args.tokens) for n in args.streams]
    print(json.dumps(rows, indent=1))
    sustained = [r["streams"] for r in rows if r["headroom"] and r["headroom"] >= 1.25]
    print(f"streams one core sustains on time (headroom >= 1.25, {args.tokens} tokens each, 8B on H100): "
          f"{max(sustained) if sustained else 0} of {args.streams}")


if __name__ == "__main__":
    main()
