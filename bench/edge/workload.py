"""Multi-tenant chat workloads shared by the routing and fairness benchmarks."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from bench.edge.common import Client, Result

WORDS = [a + b for a in ("ka", "lo", "mi", "ra", "tu", "sen", "vo", "da", "ne", "pi", "sor", "el", "an", "ti")
         for b in ("ba", "ce", "di", "fo", "gu", "ha", "ji", "ke", "lu", "mo", "ny", "pe", "qi", "ru", "sy")]


def text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


@dataclass
class Tenant:
    name: str
    key: str | None
    system_prompt: str


def tenants(n: int, prefix_words: int, seed: int, keys: list[str | None]) -> list[Tenant]:
    rng = random.Random(seed)
    return [Tenant(f"tenant{i:02d}", keys[i], f"You are the assistant of company {i}. " + text(rng, prefix_words))
            for i in range(n)]


async def conversation(client: Client, tenant: Tenant, rng: random.Random, turns: int, think_s: float,
                       user_words: int, max_tokens: int, start_delay: float) -> list[Result]:
    """One user of one tenant: several turns, each carrying the whole history (a growing prefix)."""
    await asyncio.sleep(start_delay)
    messages = [{"role": "system", "content": tenant.system_prompt}]
    out = []
    for _ in range(turns):
        messages.append({"role": "user", "content": text(rng, user_words)})
        body = {"model": "demo", "messages": messages, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        res = await client.chat(body, tenant.key, tenant.name)
        out.append(res)
        # the answer joins the history (its exact text does not matter to the prefix cache, only
        # that the next turn repeats it)
        messages.append({"role": "assistant", "content": text(rng, max_tokens)})
        await asyncio.sleep(rng.expovariate(1.0 / think_s))
    return out


async def open_loop(client: Client, tenant: Tenant, rng: random.Random, rate_per_s: float, duration_s: float,
                    prompt_words: int, max_tokens: int) -> None:
    """Poisson arrivals of independent single-turn requests from one tenant."""
    tasks = []
    loop = asyncio.get_running_loop()
    end = loop.time() + duration_s
    while loop.time() < end:
        await asyncio.sleep(rng.expovariate(rate_per_s))
        messages = [{"role": "system", "content": tenant.system_prompt},
                    {"role": "user", "content": text(rng, prompt_words)}]
        body = {"model": "demo", "messages": messages, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        tasks.append(asyncio.ensure_future(client.chat(body, tenant.key, tenant.name)))
    await asyncio.gather(*tasks)
