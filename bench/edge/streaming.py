"""Streaming cost: CPU the proxy spends per streamed token event, the Nimbus edge vs sglang-router,
on the same simulator replica. Every token of every stream crosses the proxy, so this is the
overhead a tenant feels on a long answer and what caps one proxy's streams.

    .venv/bin/python -m bench.edge.streaming [--concurrency 48] [--tokens 256] [--duration 6]

The replica runs the simulator at a very high time scale, so the engine emits tokens as fast as the
machine allows. Clients read raw bytes and count events (no JSON parsing), to leave the proxies as
much CPU as possible. The figure that matters is the proxy's CPU time per event, read from
``/proc/<pid>/stat``; events/s is reported too but depends on how the cores are shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from bench.edge.common import bench_key, new_session, one_replica_front_doors, run_async, table

KEY = bench_key("streaming")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its reaped children, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS


async def stream_load(url: str, pid: int | None, key: str | None, concurrency: int, tokens: int,
                      duration: float) -> tuple[int, float, float]:
    """(events received, seconds, proxy CPU seconds) for ``concurrency`` clients streaming back to
    back for ``duration``, after a one-second warm-up."""
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "count"}], "stream": True,
                       "max_tokens": tokens, "ignore_eos": True})
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    events = 0

    async with new_session(limit=concurrency) as session:
        async def worker(stop: float) -> None:
            nonlocal events
            while time.monotonic() < stop:
                async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as resp:
                    assert resp.status == 200, f"{url}: HTTP {resp.status}"
                    seen = 0
                    async for chunk in resp.content.iter_any():
                        seen += chunk.count(b"data: ")
                    assert seen >= tokens, f"{url}: a stream ended after {seen} events"
                    events += seen

        await asyncio.gather(*(worker(time.monotonic() + 1.0) for _ in range(concurrency)))  # warm-up
        events = 0
        cpu0 = cpu_seconds(pid) if pid else 0.0
        t0 = time.monotonic()
        await asyncio.gather(*(worker(t0 + duration) for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
        return events, elapsed, (cpu_seconds(pid) - cpu0) if pid else 0.0


def measure(url: str, pid: int | None, key: str | None, args) -> tuple[float, float]:
    """(events/s, proxy CPU microseconds per event)."""
    events, elapsed, cpu = run_async(stream_load(url, pid, key, args.concurrency, args.tokens, args.duration))
    return events / elapsed, cpu / events * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="simulator speed-up; at 1 each decode step is one small write per stream, as in serving")
    args = ap.parse_args()
    with one_replica_front_doors(KEY, ["--time-scale", str(args.time_scale)]) as targets:
        rate: dict[str, list[float]] = {k: [] for k in targets}
        cost: dict[str, list[float]] = {k: [] for k in targets}
        for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits all alike
            for name, (url, key) in targets.items():
                r, c = measure(url, getattr(url, "pid", None), key, args)
                rate[name].append(r)
                cost[name].append(c)
    rows = [["target", "events/s (best)", "proxy CPU us/event (median)", "per round"]]
    for name in targets:
        per = " ".join(f"{c:.1f}" for c in cost[name]) if name != "direct" else "-"
        med = statistics.median(cost[name])
        rows.append([name, f"{max(rate[name]):.0f}", f"{med:.1f}" if name != "direct" else "-", per])
    print(table(rows))
    e, s = (statistics.median(cost[n]) for n in ("nimbus-edge", "sglang-router"))
    print(f"\nedge/sglang-router CPU per streamed event: {e / s:.2f}x")
    print(f"edge/sglang-router streamed events/s: {max(rate['nimbus-edge']) / max(rate['sglang-router']):.2f}x")


if __name__ == "__main__":
    main()
