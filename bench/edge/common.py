"""Shared pieces of the edge benchmarks: the simulator fleet, the three front doors (direct, the
Nimbus edge, sglang-router), and an asyncio load generator that measures what a client sees."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from dataplane.edge.process import EdgeProcess
from dataplane.sim.process import SimProcess, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_KEY_PREFIX = "nmb_bench"


class ProcessUrl(str):
    """A front door's base URL that also names the process serving it (for CPU accounting)."""

    pid: int

    def __new__(cls, url: str, pid: int) -> ProcessUrl:
        self = super().__new__(cls, url)
        self.pid = pid
        return self


def bench_key(i: int | str) -> str:
    return f"nmb_bench{str(i)[:3]:0>3}_{uuid.uuid5(uuid.NAMESPACE_OID, str(i)).hex}"


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


@contextlib.contextmanager
def sglang_router(worker_urls: list[str], policy: str, extra: list[str] | None = None) -> Iterator[ProcessUrl]:
    port = free_port()
    args = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy, "--log-level", "error", *(extra or [])]
    log = tempfile.NamedTemporaryFile(prefix="sglang-router-", suffix=".log", delete=False)
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 60)
        yield ProcessUrl(f"http://127.0.0.1:{port}", proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)


@contextlib.contextmanager
def nimbus_edge(replicas: list[dict[str, Any]], tenants: list[dict[str, Any]], settings: dict[str, Any],
                redis_url: str = "none", priority_scheduling: str | None = None) -> Iterator[ProcessUrl]:
    cfg = {"settings": settings, "models": [{"name": "demo", "tiers": [
        {"tier": "bf16", "served_model_name": "demo", "context_length": 131072, "replicas": replicas,
         "priority_scheduling": priority_scheduling}]}],
        "tenants": tenants}
    edge = EdgeProcess(cfg, redis_url=redis_url, log_path=os.environ.get("NIMBUS_BENCH_EDGE_LOG"))
    edge.start(timeout=30)
    try:
        assert edge.proc is not None
        yield ProcessUrl(edge.url, edge.proc.pid)
    finally:
        edge.close()


@contextlib.contextmanager
def one_replica_front_doors(key: str, sim_args: list[str]) -> Iterator[dict[str, tuple[ProcessUrl | str, str | None]]]:
    """One simulator replica reached three ways, for the overhead-style benches: ``{"direct": (url,
    None), "nimbus-edge": (url, key), "sglang-router": (url, None)}``. The edge and sglang-router
    URLs carry their process id; the replica's slots are never what limits them."""
    with SimProcess(served_model_name="demo", extra_args=["--jitter", "0", "--max-running-requests", "4096",
                                                          *sim_args], ready_delay=0.0) as sim, \
            nimbus_edge([{"url": sim.url, "max_running_requests": 4096}], [{"name": "bench", "keys": [{"dev_key": key}]}],
                        {"health_interval_s": 30}, redis_url="redis://127.0.0.1:6379/0") as edge, \
            sglang_router([sim.url], "cache_aware") as router:
        yield {"direct": (sim.url, None), "nimbus-edge": (edge, key), "sglang-router": (router, None)}


def flush_caches(urls: list[str]) -> None:
    for url in urls:
        for _ in range(50):
            try:
                req = urllib.request.Request(url + "/flush_cache", method="POST")
                with urllib.request.urlopen(req, timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.1)


@dataclass
class Result:
    ok: bool
    status: int = 0
    latency: float = 0.0
    ttft: float = float("nan")
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    tenant: str = ""
    start: float = 0.0
    text: list[str] | None = None  # the streamed answer's pieces, when the caller asked for them


@dataclass
class Client:
    base_url: str
    session: aiohttp.ClientSession
    results: list[Result] = field(default_factory=list)

    async def chat(self, body: dict[str, Any], key: str | None = None, tenant: str = "",
                   keep_text: bool = False) -> Result:
        """``keep_text``: collect a streamed answer's text in ``Result.text`` (parses every event)."""
        headers = {"content-type": "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        t0 = time.perf_counter()
        res = Result(ok=False, tenant=tenant, start=time.monotonic(), text=[] if keep_text else None)
        try:
            async with self.session.post(self.base_url + "/v1/chat/completions", data=json.dumps(body),
                                         headers=headers) as resp:
                res.status = resp.status
                if not body.get("stream"):
                    data = await resp.read()
                    res.latency = res.ttft = time.perf_counter() - t0
                    if resp.status == 200:
                        usage = json.loads(data).get("usage") or {}
                        _fill_usage(res, usage)
                        res.ok = True
                else:
                    buf = b""
                    async for chunk in resp.content.iter_any():
                        buf += chunk
                        while b"\n\n" in buf:
                            event, buf = buf.split(b"\n\n", 1)
                            _read_event(res, event, t0)
                    res.latency = time.perf_counter() - t0
                    res.ok = resp.status == 200 and not math.isnan(res.ttft)
        except (aiohttp.ClientError, TimeoutError) as exc:
            res.latency = time.perf_counter() - t0
            res.status = -1
            print(f"request failed: {exc!r}", file=sys.stderr)
        self.results.append(res)
        return res


def _fill_usage(res: Result, usage: dict[str, Any]) -> None:
    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    res.completion_tokens = int(usage.get("completion_tokens") or 0)
    res.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def _read_event(res: Result, event: bytes, t0: float) -> None:
    event = event.strip()
    if not event.startswith(b"data:") or event.endswith(b"[DONE]"):
        return
    if not math.isnan(res.ttft) and res.text is None and b'"usage"' not in event:
        return  # past the first token only usage matters; parsing every token would make the load
        # generator, which shares the cores with engines and routers, a source of latency itself
    obj = json.loads(event[5:])
    if obj.get("usage"):
        _fill_usage(res, obj["usage"])
    for choice in obj.get("choices") or ():
        piece = (choice.get("delta") or {}).get("content") or choice.get("text")
        if math.isnan(res.ttft) and piece:
            res.ttft = time.perf_counter() - t0
        if piece and res.text is not None:
            res.text.append(piece)


def new_session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=600))


def run_async(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
