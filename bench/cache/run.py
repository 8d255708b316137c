"""The semantic cache on this CPU: lookup latency, what it costs the edge's peak throughput, and
what it saves on a workload with repeated and paraphrased questions.

    .venv/bin/python -m bench.cache.run [--entries 2000] [--duration 8] [--requests 600]

1. **Lookup latency** (``SemanticCache.lookup`` against the real Redis, a scope of ``--entries``
   entries): the embedding of one question, the index search, and the whole lookup (embedding,
   search, the answer's GET), p50 and p99 over sequential lookups, hits and misses. Then the index
   alone under a stream of new questions (each searched, then stored, at the entry bound so one
   leaves per store), at 2,000 and 10,000 entries in one scope: the edge's work per miss besides
   the embedding and Redis.
2. **Peak req/s** through the edge, closed loop (``--concurrency``), every question new (0 % hits:
   each request is embedded, searched, answered by the engine and stored), against the same edge
   with the tenant not opted in. The simulator runs at a high time scale, so the edge's own work is
   what is measured. The embedding is CPU work the edge did not do before; the bound on the ratio
   is edge CPU per request / (edge CPU per request + embedding CPU per request).
3. **Repeated questions**: ``--requests`` questions from the quality set at ``--rate`` req/s,
   30 % of them a repeat or a paraphrase of an earlier one (the rest new), through the edge with
   the semantic cache and without: TTFT p50 and the engines' tokens (prompt + completion) saved.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time
import uuid
from collections.abc import Callable

import httpx
import numpy as np
import redis.asyncio as aioredis

from bench.cache.quality import load_pairs
from bench.edge.common import Client, bench_key, new_session, nimbus_edge, pct, run_async, table
from bench.edge.overhead import peak
from dataplane.agent import scrape
from dataplane.edge.embedder import Embedder
from dataplane.edge.response_cache import SharedResponseCache
from dataplane.edge.semantic_cache import SemanticCache, guard_terms
from dataplane.edge.semantic_index import Entry, SemanticIndex
from dataplane.sim.process import SimProcess

REDIS = "redis://127.0.0.1:6379/0"
KEY_ON, KEY_OFF = bench_key("semantic-on"), bench_key("semantic-off")
TENANTS = [{"name": "on", "semantic_cache": {"models": ["demo"], "threshold": 0.875}, "keys": [{"dev_key": KEY_ON}]},
           {"name": "off", "keys": [{"dev_key": KEY_OFF}]}]


# ---------------------------------------------------------------------------------------------
# 1. lookup latency


async def lookup_latency(entries: int, lookups: int) -> dict[str, tuple[float, float]]:
    client = aioredis.from_url(REDIS)
    prefix = f"bench:scache:{uuid.uuid4().hex}:"
    answers = SharedResponseCache(client, prefix, "bench", max_entries=entries * 2)
    embedder = Embedder()
    embedder.start()
    assert await embedder.wait_ready(), embedder.error
    cache = SemanticCache(client, answers, embedder, prefix, "bench", max_entries=entries * 2)
    await cache.start()
    await cache.synced.wait()
    pairs = load_pairs()
    questions = [p["a"] for p in pairs] + [p["b"] for p in pairs]
    rng = random.Random(7)
    stored = rng.sample(questions, min(entries, len(questions)))
    while len(stored) < entries:  # more entries than the set has questions: numbered variants
        stored.append(f"{rng.choice(questions)} (case {len(stored)})")
    vectors = embedder.encode_sync(stored)
    scope = "bench-scope"
    for question, vector in zip(stored, vectors, strict=True):
        await cache.store("bench-tenant", scope, question, vector, b'{"answer": "cached"}')
    embed_ms, search_ms, lookup_ms = [], [], []
    hits = 0
    for i in range(lookups):
        # Half the lookups ask a stored question again (hits), half a new one (misses).
        question = stored[i % len(stored)] if i % 2 else f"What happened in the year {1000 + i} in {rng.choice(questions)}?"
        t0 = time.perf_counter()
        vector = await embedder.encode(question)
        t1 = time.perf_counter()
        cache.index.search(scope, vector, guard_terms(question), 0.875, time.time())
        t2 = time.perf_counter()
        found = await cache.lookup("bench-tenant", scope, question, 0.875)
        t3 = time.perf_counter()
        hits += found.state == "hit"
        embed_ms.append((t1 - t0) * 1000)
        search_ms.append((t2 - t1) * 1000)
        lookup_ms.append((t3 - t2) * 1000)
    await cache.stop()
    keys = [k async for k in client.scan_iter(match=prefix + "*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()
    print(f"  {lookups} lookups in a scope of {entries} entries, {hits} hits")
    return {name: (pct(v, 50), pct(v, 99)) for name, v in
            (("embedding", embed_ms), ("index search", search_ms), ("whole lookup", lookup_ms))}


def index_churn(entries: int, questions: int = 300, dim: int = 384, seed: int = 3) -> tuple[float, float]:
    """p50 and p99 ms of one search followed by one store in a full scope of ``entries``."""
    rng = np.random.default_rng(seed)

    def unit() -> np.ndarray:
        v = rng.standard_normal(dim).astype(np.float32)
        return v / np.linalg.norm(v)

    index = SemanticIndex(max_entries=entries)
    expires = time.time() + 3600
    for i in range(entries):
        index.add(Entry(f"old{i}", "t", "scope", "q", unit(), frozenset(), expires))
    took = []
    for i in range(questions):
        vector = unit()
        t0 = time.perf_counter()
        index.search("scope", vector, frozenset(), 0.875, time.time())
        index.add(Entry(f"new{i}", "t", "scope", "q", vector, frozenset(), expires))
        took.append((time.perf_counter() - t0) * 1000)
    return pct(took, 50), pct(took, 99)


# ---------------------------------------------------------------------------------------------
# 2. peak throughput, 0 % hits


def new_question(tag: str) -> Callable[[int], dict]:
    """Bodies whose questions are all new (and deterministic, so the cache is consulted)."""
    return lambda n: {"model": "demo", "temperature": 0, "max_tokens": 1,
                      "messages": [{"role": "user", "content": f"Question {tag}-{n}: what happened in year {n}?"}]}


def wait_semantic_ready(url: str, key: str, timeout: float = 120.0) -> None:
    """Until the edge's embedding model has loaded (it loads in the background once a tenant opts
    in): before that every request says ``x-nimbus-cache: bypass``."""
    deadline = time.monotonic() + timeout
    for n in itertools.count():
        r = httpx.post(url + "/v1/chat/completions", json=new_question("ready")(n),
                       headers={"authorization": f"Bearer {key}"}, timeout=30)
        if r.headers.get("x-nimbus-cache") != "bypass":
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the edge's semantic cache never became ready")
        time.sleep(0.5)


def closed_loop(url, key: str, duration: float, concurrency: int, tag: str):
    return peak(url, duration, concurrency, key, new_question(tag))


def private_settings() -> dict:
    """Edge settings with a Redis key prefix of this run's own: entries another run (or arm) left
    in the shared Redis would answer this one's questions."""
    return {"health_interval_s": 30, "redis_key_prefix": f"bench:cache:{uuid.uuid4().hex}:"}


def drop_keys(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)


def peak_ratio(duration: float, concurrency: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    settings = private_settings()
    with SimProcess(served_model_name="demo", extra_args=["--jitter", "0", "--max-running-requests", "4096",
                                                          "--time-scale", "10000"], ready_delay=0.0) as sim, \
            nimbus_edge([{"url": sim.url, "max_running_requests": 4096}], TENANTS, settings, redis_url=REDIS) as edge:
        wait_semantic_ready(edge, KEY_ON)
        out: dict[str, list[tuple[float, float]]] = {"cache off": [], "semantic cache on, 0 % hits": []}
        for r in range(rounds):  # alternate, so drift on a shared machine hits both alike
            out["cache off"].append(run_async(closed_loop(edge, KEY_OFF, duration, concurrency, f"off{r}")))
            out["semantic cache on, 0 % hits"].append(
                run_async(closed_loop(edge, KEY_ON, duration, concurrency, f"on{r}")))
    drop_keys(settings["redis_key_prefix"])
    return out


# ---------------------------------------------------------------------------------------------
# 3. a workload with repeats and paraphrases


def repeat_workload(n: int, share: float, seed: int = 11) -> list[str]:
    pairs = [p for p in load_pairs() if p["should_hit"]]
    rng = random.Random(seed)
    rng.shuffle(pairs)
    asked: list[dict] = []
    questions = []
    fresh = iter(pairs)
    for _ in range(n):
        if asked and rng.random() < share:
            earlier = rng.choice(asked)
            questions.append(rng.choice([earlier["a"], earlier["b"]]))  # the same question, or its paraphrase
        else:
            p = next(fresh)
            asked.append(p)
            questions.append(p["a"])
    return questions


async def open_loop(url: str, key: str, questions: list[str], rate: float) -> list:
    async with new_session() as session:
        client = Client(url, session)
        rng = random.Random(3)
        tasks = []
        for q in questions:
            body = {"model": "demo", "temperature": 0, "max_tokens": 48, "stream": True,
                    "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": q}]}
            tasks.append(asyncio.create_task(client.chat(body, key)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
        return client.results


def engine_tokens(url: str) -> float:
    counters = scrape.parse(httpx.get(url + "/metrics", timeout=5).text).counters
    return sum(counters.get(name, counters.get(name.removesuffix("_total"), 0.0))
               for name in ("prompt_tokens_total", "generation_tokens_total"))


def savings(n: int, rate: float) -> dict[str, dict]:
    questions = repeat_workload(n, 0.3)
    out = {}
    for name, key in (("no cache", KEY_OFF), ("semantic cache", KEY_ON)):
        # A fresh engine, edge and key prefix per arm: no prefix cache or entries carried over.
        settings = private_settings()
        with SimProcess(served_model_name="demo", extra_args=["--max-running-requests", "64", "--enable-metrics"],
                        ready_delay=0.0) as sim, \
                nimbus_edge([{"url": sim.url, "max_running_requests": 64}], TENANTS, settings, redis_url=REDIS) as edge:
            if key == KEY_ON:
                wait_semantic_ready(edge, KEY_ON)
            before = engine_tokens(sim.url)
            results = run_async(open_loop(edge, key, questions, rate))
            # From the engine's own counters: a cached answer replays the usage it had, so the
            # client's numbers would count it again.
            used = engine_tokens(sim.url) - before
            out[name] = {"ttft_p50_ms": statistics.median(r.ttft for r in results if r.ok) * 1000,
                         "ttft_p90_ms": pct([r.ttft * 1000 for r in results if r.ok], 90),
                         "errors": sum(not r.ok for r in results), "requests": len(results),
                         "engine_tokens": used}
        drop_keys(settings["redis_key_prefix"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--lookups", type=int, default=600)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rate", type=float, default=8.0)
    args = ap.parse_args(argv)

    print("1. lookup latency")
    lat = run_async(lookup_latency(args.entries, args.lookups))
    print(table([["step", "p50 ms", "p99 ms"]] + [[k, f"{a:.2f}", f"{b:.2f}"] for k, (a, b) in lat.items()]))
    churn = [[f"{n} entries", *(f"{v:.2f}" for v in index_churn(n))] for n in (2000, 10_000)]
    print("  the index under new questions (search, then store):")
    print(table([["scope", "p50 ms", "p99 ms"], *churn]))

    print("\n2. peak req/s through the edge")
    peaks = peak_ratio(args.duration, args.concurrency, args.rounds)
    rows = [["tenant", "peak req/s (rounds)", "edge CPU us/req (rounds)"]]
    for name, runs in peaks.items():
        rows.append([name, ", ".join(f"{r:.0f}" for r, _ in runs), ", ".join(f"{c:.0f}" for _, c in runs)])
    print(table(rows))
    off = max(r for r, _ in peaks["cache off"])
    on = max(r for r, _ in peaks["semantic cache on, 0 % hits"])
    cpu_off = min(c for _, c in peaks["cache off"])
    cpu_on = min(c for _, c in peaks["semantic cache on, 0 % hits"])
    print(f"ratio on/off: {on / off:.2f}x (target >= 0.9x). The edge's CPU per request: {cpu_off:.0f} us without "
          f"the cache, {cpu_on:.0f} us with it (the embedding, batched as requests wait); the model alone takes "
          f"{lat['embedding'][0]:.1f} ms per question one at a time. Work that grows {cpu_on / cpu_off:.0f}x per "
          f"request cannot keep 0.9x of the peak on the same cores")

    print("\n3. 30 % repeated or paraphrased questions")
    res = savings(args.requests, args.rate)
    rows = [["", "requests", "errors", "TTFT p50 ms", "TTFT p90 ms", "engine tokens"]]
    for name, r in res.items():
        rows.append([name, str(r["requests"]), str(r["errors"]), f"{r['ttft_p50_ms']:.1f}", f"{r['ttft_p90_ms']:.1f}",
                     str(r["engine_tokens"])])
    print(table(rows))
    base, cached = res["no cache"], res["semantic cache"]
    print(f"engine tokens saved: {1 - cached['engine_tokens'] / base['engine_tokens']:.1%}; TTFT p50 "
          f"{cached['ttft_p50_ms'] / base['ttft_p50_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
