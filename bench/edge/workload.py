"""Multi-tenant chat workloads shared by the routing and fairness benchmarks."""

from __future__ import annotations

import asyncio
import math
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


def long_tailed(rng: random.Random, median: int, sigma: float = 1.0, cap: float = 16.0) -> int:
    """An output length from a log-normal around ``median`` (capped at ``cap`` x it): most answers
    short, a few many times longer, as real chat traffic has them."""
    return max(1, min(round(median * cap), round(rng.lognormvariate(math.log(median), sigma))))


async def conversation(client: Client, tenant: Tenant, rng: random.Random, turns: int, think_s: float,
                       user_words: int, max_tokens: int, start_delay: float, *, real_answers: bool = False,
                       long_tail: bool = False) -> list[Result]:
    """One user of one tenant: several turns, each carrying the whole history (a growing prefix).
    ``real_answers``: the history carries the streamed answers as they came (else words of the
    answer's length: the prefix cache only needs the next turn to repeat them). ``long_tail``:
    each turn's output length is drawn by ``long_tailed`` around ``max_tokens``."""
    await asyncio.sleep(start_delay)
    messages = [{"role": "system", "content": tenant.system_prompt}]
    out = []
    for _ in range(turns):
        messages.append({"role": "user", "content": text(rng, user_words)})
        tokens = long_tailed(rng, max_tokens) if long_tail else max_tokens
        body = {"model": "demo", "messages": messages, "max_tokens": tokens, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        res = await client.chat(body, tenant.key, tenant.name, keep_text=real_answers)
        out.append(res)
        answer = "".join(res.text) if res.text else text(rng, tokens)
        messages.append({"role": "assistant", "content": answer})
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
