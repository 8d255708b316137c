"""How many concurrent streams one simulator process sustains on one core, on time.

    .venv/bin/python -m bench.sim.efficiency [--streams 100 200 400 800] [--tokens 64]

For each concurrency N it starts a fresh simulator pinned to CPU 0 (``taskset``), real time
(``--time-scale 1``), Llama-3.1-8B on an H100, and opens N OpenAI completion streams at once
from a raw-socket asyncio client pinned to the other CPU (a heavy client would measure
itself). The simulator reports, per scheduler step, how late it woke up against its own
absolute schedule (``/_sim/stats``). A concurrency level "keeps time" when fewer than 5% of
steps are late (late = more than 20% of the step's own duration and 2 ms) and the whole run
takes less than 10% longer in wall time than the schedule the timing model asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
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


def measure(streams: int, tokens: int) -> dict:
    sim = SimProcess(extra_args=["--time-scale", "1", "--jitter", "0"])
    if shutil.which("taskset"):
        sim.args = ["taskset", "-c", "0", *sim.args]
    with sim:
        wall, events = asyncio.run(run_level(sim.port, streams, tokens))
        stats = httpx.get(sim.url + "/_sim/stats").json()
    lag = stats["lag"]
    late_pct = 100 * lag["late_steps"] / max(1, lag["steps"])
    stretch = wall / lag["busy_s"] if lag["busy_s"] else float("nan")
    return {
        "streams": streams,
        "events": events,
        "wall_s": round(wall, 3),
        "scheduled_s": round(lag["busy_s"], 3),
        "stretch": round(stretch, 3),
        "steps": lag["steps"],
        "late_steps_pct": round(late_pct, 1),
        "mean_lag_ms": round(lag["mean_lag_ms"], 2),
        "max_lag_ms": round(lag["max_lag_ms"], 1),
        "tokens_per_s": round(stats["generation_tokens"] / wall),
        "keeps_time": late_pct < 5 and stretch < 1.10,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, nargs="+", default=[50, 100, 200, 400, 800])
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    if shutil.which("taskset"):
        os.sched_setaffinity(0, {1 % os.cpu_count()})  # the client stays off the simulator's core
    rows = [measure(n, args.tokens) for n in args.streams]
    print(json.dumps(rows, indent=1))
    sustained = [r["streams"] for r in rows if r["keeps_time"]]
    print(f"max concurrent streams on time (one core, {args.tokens} tokens each): "
          f"{max(sustained) if sustained else 0}")


if __name__ == "__main__":
    main()
