"""Overhead: the same simulator replica reached directly, through the Nimbus edge, and through
sglang-router. Added p50/p99 latency at concurrency 1 and peak requests/s in a closed loop.

    .venv/bin/python -m bench.edge.overhead [--requests 400] [--duration 5] [--concurrency 32]

The replica runs the simulator at a very high time scale, so model time is ~0 and what is left is
HTTP and proxy overhead. All processes share this machine's cores, as they would on one host.

The last column is the proxy's own CPU time per request in the closed loop (``/proc/<pid>/stat``):
on a shared, busy machine it moves far less than req/s does, so it is the figure to compare two
versions of the edge by (alternate their runs).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import time
from collections.abc import Callable

from bench.edge.common import (
    Client,
    bench_key,
    new_session,
    one_replica_front_doors,
    pct,
    run_async,
    table,
)

KEY = bench_key("overhead")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS
BODY = {"model": "demo", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}


async def latency(url: str, n: int, key: str | None) -> list[float]:
    async with new_session() as session:
        client = Client(url, session)
        for _ in range(20):
            await client.chat(BODY, key)
        client.results.clear()
        for _ in range(n):
            await client.chat(BODY, key)
        assert all(r.ok for r in client.results), f"errors against {url}"
        return [r.latency * 1000 for r in client.results]


async def peak(url: str, duration: float, concurrency: int, key: str | None,
               body: Callable[[int], dict] = lambda _: BODY) -> tuple[float, float]:
    """(requests/s, the proxy's CPU microseconds per request; 0 when the URL names no process).
    ``body(n)`` is the n-th request's body (the same ping by default)."""
    async with new_session(limit=concurrency) as session:
        client = Client(url, session)
        stop = time.monotonic() + duration
        counter = itertools.count()

        async def worker() -> None:
            while time.monotonic() < stop:
                await client.chat(body(next(counter)), key)

        pid = getattr(url, "pid", None)
        cpu0 = cpu_seconds(pid)
        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
        cpu = cpu_seconds(pid) - cpu0
        ok = sum(r.ok for r in client.results)
        return ok / elapsed, (cpu / ok * 1e6 if ok and pid else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with one_replica_front_doors(KEY, ["--time-scale", "10000"]) as targets:
        lat: dict[str, list[float]] = {k: [] for k in targets}
        thr: dict[str, list[float]] = {k: [] for k in targets}
        cpu: dict[str, list[float]] = {k: [] for k in targets}
        for _ in range(args.rounds):  # interleaved rounds, so drift on a shared machine hits all alike
            for name, (url, key) in targets.items():
                lat[name] += run_async(latency(url, args.requests // args.rounds, key))
                rate, us = run_async(peak(url, args.duration, args.concurrency, key))
                thr[name].append(rate)
                cpu[name].append(us)
    d50, d99 = pct(lat["direct"], 50), pct(lat["direct"], 99)
    rows = [["target", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "peak req/s", "proxy CPU us/req"]]
    for name in targets:
        p50, p99 = pct(lat[name], 50), pct(lat[name], 99)
        rows.append([name, f"{p50:.2f}", f"{p99:.2f}", f"{p50 - d50:+.2f}", f"{p99 - d99:+.2f}",
                     f"{max(thr[name]):.0f}", f"{min(cpu[name]):.0f}" if any(cpu[name]) else "-"])
    print(table(rows))
    e_add = pct(lat["nimbus-edge"], 50) - d50
    r_add = pct(lat["sglang-router"], 50) - d50
    ratio = max(thr["nimbus-edge"]) / max(thr["sglang-router"])
    # Issue 19's targets: at least sglang-router's peak, at most its added p50.
    print(f"\nedge/sglang-router peak throughput: {ratio:.2f}x (target >= 1.0x)")
    print(f"edge/sglang-router added p50: {e_add / r_add if r_add > 0 else float('nan'):.2f}x (target <= 1.0x)")


if __name__ == "__main__":
    main()
