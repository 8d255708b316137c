"""Usage survives an edge crash: an edge SIGKILLed again and again under load, with its Redis up or
down, and every answered request's usage event is in the Redis stream afterwards (duplicates are
allowed: consumers dedupe on ``request_id``).

    .venv/bin/python -m bench.edge.usage_crash --kills 20            # Redis up, then Redis down

Each round starts an edge on the same port and state dir, lets 4 client threads (half streaming,
half not) run against it for a random 0.3 s .. ``--load-s``, and SIGKILLs it. A request counts as
answered when the client got its whole response (a 200 body, or a stream through ``[DONE]``).
"Redis down" points the edge at a redis-server of its own that is stopped for all the kills and
started for one last edge start that replays the spool. Only redis-servers started here are stopped.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.edge.private_redis import PrivateRedis
from controlplane.services.usage_rollup import events_of
from dataplane.edge.process import EdgeProcess
from dataplane.sim.process import free_port, sim_fleet

KEY = "nmb_crash001_not-a-secret-usage-crash"
STREAM = "nimbus:usage"


class OwnRedis(PrivateRedis):
    """The run's own Redis, which the edge's usage stream goes to."""

    def ids(self) -> list[str]:
        return [e["request_id"] for _, f in self.client().xrange(STREAM) for e in events_of(f)]


def edge_config(sim_urls: list[str]) -> dict[str, Any]:
    return {"models": [{"name": "demo", "default_tier": "bf16", "tiers": [
        {"tier": "bf16", "served_model_name": "demo",
         "replicas": [{"url": u, "max_running_requests": 32} for u in sim_urls]}]}],
        "tenants": [{"name": "crash", "keys": [{"dev_key": KEY}]}]}


class Load:
    """Client threads that keep calling the edge's port through its deaths and restarts."""

    def __init__(self, port: int, threads: int = 4) -> None:
        self.port = port
        self.answered: set[str] = set()
        self.failed = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _loop(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            stream = (i + n) % 2 == 0
            body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": f"hello {i} {n}"}],
                               "max_tokens": 4, "stream": stream}).encode()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("POST", "/v1/chat/completions", body,
                             {"authorization": f"Bearer {KEY}", "content-type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                rid = resp.getheader("x-request-id")
                conn.close()
            except (OSError, http.client.HTTPException):
                with self._lock:
                    self.failed += 1
                time.sleep(0.02)  # the edge is down or restarting
                continue
            done = resp.status == 200 and (b"data: [DONE]" in data if stream else b'"choices"' in data)
            if done and rid:
                with self._lock:
                    self.answered.add(rid)


def crash_run(sim_urls: list[str], kills: int, redis_down: bool, workdir: Path, *, load_s: float = 1.0,
              seed: int = 0, drain_timeout_s: float = 30.0) -> dict[str, Any]:
    rng = random.Random(seed)
    redis = OwnRedis(workdir / "redis")
    if not redis_down:
        redis.start()
    state_dir = workdir / "edge-state"
    port = free_port()
    cfg = edge_config(sim_urls)
    settings = {"redis_retry_s": 0.2, "health_interval_s": 30}

    def edge() -> EdgeProcess:
        return EdgeProcess(cfg, state_dir=state_dir, port=port, redis_url=redis.url, settings=settings,
                           log_path=workdir / "edge.log")

    t0 = time.monotonic()
    try:
        with Load(port) as load:
            for _ in range(kills):
                e = edge().start(timeout=30)
                time.sleep(rng.uniform(0.3, max(0.3, load_s)))
                assert e.proc is not None
                e.proc.kill()  # SIGKILL: no shutdown, no flush
                e.proc.wait()
        answered = set(load.answered)
        if redis_down:
            redis.start()  # same port, empty: everything must come from the spool
        e = edge().start(timeout=30)
        try:
            deadline = time.monotonic() + drain_timeout_s
            while time.monotonic() < deadline and not answered <= set(redis.ids()):
                time.sleep(0.1)
        finally:
            e.stop()
        ids = redis.ids()
    finally:
        redis.stop()
    seen = set(ids)
    return {"redis": "down" if redis_down else "up", "kills": kills, "answered": len(answered),
            "lost": len(answered - seen), "events": len(ids), "unique": len(seen),
            "repeats": len(ids) - len(seen), "client_failures": load.failed,
            "seconds": round(time.monotonic() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--load-s", type=float, default=1.5, help="longest run of an edge before its SIGKILL")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=("up", "down"))
    args = p.parse_args()
    with sim_fleet(2, served_model_name="demo", extra_args=["--time-scale", "20"], ready_delay=0.0) as sims:
        urls = [s.url for s in sims]
        for mode in ("up", "down"):
            if args.only and args.only != mode:
                continue
            with tempfile.TemporaryDirectory(prefix="nimbus-usage-crash-") as tmp:
                print(json.dumps(crash_run(urls, args.kills, mode == "down", Path(tmp), load_s=args.load_s,
                                           seed=args.seed)), flush=True)


if __name__ == "__main__":
    main()
