"""Semantic response cache: a deterministic request whose question means the same as one answered
before, in the same scope, gets that answer.

* **Scope** (``semantic_scope``): a hard partition, hashed like the exact cache's key: tenant,
  variant, endpoint, and the whole request but its question: the system prompt, earlier turns,
  every sampling parameter. Only the question (the last user message, or a completion's prompt)
  is compared by meaning; everything else must be equal.
* **Meaning**: cosine similarity of sentence embeddings (``embedder.py``) at or above the
  tenant's threshold, and
* **Guard** (``guard_terms``): what embeddings blur must be equal: numbers, negation, units,
  dates and names. "What is 15% of 240?" and "What is 15% of 340?" embed almost alike; no
  threshold separates paraphrases from such near misses (``bench/cache``), the guard does.

Storage: every entry is one record in the region's log stream (``{prefix}scache:{region}:log``:
id, tenant, scope, question, vector, expiry), which is also the index's source of truth, and
its answer is an entry of the shared exact store (``SharedResponseCache``) under the tenant, so
it shares that store's TTL, count and size bounds. Every edge replays the log at start and tails
it, so each keeps the region's index in memory (``semantic_index.SemanticIndex``: exact cosine search
per scope) and a new edge starts warm. A purge (``{op: purge, tenant}``) in the log drops a tenant's
entries everywhere. With Redis or the model unavailable the cache is bypassed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
from redis.exceptions import TimeoutError as RedisTimeout

from dataplane.edge.embedder import Embedder
from dataplane.edge.response_cache import BYPASS, HIT, MISS, TRANSPORT_FIELDS, SharedResponseCache
from dataplane.edge.semantic_index import Entry, SemanticIndex

log = logging.getLogger("nimbus.edge.semantic")

SEMANTIC = "semantic"
BODY_PREFIX = "s:"  # a semantic entry's answer in the shared store
FOLLOW_BLOCK_MS = 250  # how long one read of the region's log waits for a new record
FOLLOW_LATE_READS = 3  # tailing reads in a row past the socket timeout before the log counts as unavailable

# ---------------------------------------------------------------------------------------------
# Scope and question


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "\n".join(str(p.get("text", "")) for p in content)
    return None  # images, audio: no meaning to compare


def semantic_scope(tenant_id: str, variant_id: str, kind: str, body: dict[str, Any]) -> tuple[str, str] | None:
    """(scope hash, question) of a request, or None when it has no single text question."""
    rest = {k: v for k, v in body.items() if k not in TRANSPORT_FIELDS}
    if isinstance(rest.get("messages"), list) and rest["messages"]:
        *before, last = rest.pop("messages")
        if not isinstance(last, dict) or last.get("role") != "user":
            return None
        question = _text(last.get("content"))
        rest["history"] = before
    elif isinstance(rest.get("prompt"), str):
        question = rest.pop("prompt")
    else:
        return None
    if question is None or not question.strip():
        return None
    blob = msgspec.json.encode([tenant_id, variant_id, kind, rest], order="sorted")
    return hashlib.sha256(blob).hexdigest(), question


# ---------------------------------------------------------------------------------------------
# Guard: the terms embeddings blur


_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?%?")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
_NEGATIONS = frozenset("""not no never none nothing nobody nowhere neither nor without cannot
cant dont doesnt didnt isnt arent wasnt werent wont wouldnt shouldnt couldnt hasnt havent""".split())
_UNITS = {
    **dict.fromkeys(("km", "kilometer", "kilometers", "kilometre", "kilometres"), "km"),
    **dict.fromkeys(("mile", "miles", "mi"), "mi"),
    **dict.fromkeys(("m", "meter", "meters", "metre", "metres"), "m"),
    **dict.fromkeys(("cm", "centimeter", "centimeters", "centimetre", "centimetres"), "cm"),
    **dict.fromkeys(("mm", "millimeter", "millimeters"), "mm"),
    **dict.fromkeys(("ft", "foot", "feet"), "ft"),
    **dict.fromkeys(("in", "inch", "inches"), "in"),
    **dict.fromkeys(("kg", "kilogram", "kilograms", "kilo", "kilos"), "kg"),
    **dict.fromkeys(("g", "gram", "grams"), "g"),
    **dict.fromkeys(("lb", "lbs", "pound", "pounds"), "lb"),
    **dict.fromkeys(("oz", "ounce", "ounces"), "oz"),
    **dict.fromkeys(("l", "liter", "liters", "litre", "litres"), "l"),
    **dict.fromkeys(("ml", "milliliter", "milliliters"), "ml"),
    **dict.fromkeys(("gallon", "gallons", "gal"), "gal"),
    **dict.fromkeys(("celsius", "°c"), "c"),
    **dict.fromkeys(("fahrenheit", "°f"), "f"),
    **dict.fromkeys(("second", "seconds", "sec", "secs"), "s"),
    **dict.fromkeys(("minute", "minutes", "min", "mins"), "min"),
    **dict.fromkeys(("hour", "hours", "hr", "hrs"), "h"),
    **dict.fromkeys(("day", "days"), "day"),
    **dict.fromkeys(("week", "weeks"), "week"),
    **dict.fromkeys(("month", "months"), "month"),
    **dict.fromkeys(("year", "years"), "year"),
    **dict.fromkeys(("dollar", "dollars", "usd", "$"), "usd"),
    **dict.fromkeys(("euro", "euros", "eur", "€"), "eur"),
    **dict.fromkeys(("byte", "bytes"), "b"),
    **dict.fromkeys(("kb", "kilobyte", "kilobytes"), "kb"),
    **dict.fromkeys(("mb", "megabyte", "megabytes"), "mb"),
    **dict.fromkeys(("gb", "gigabyte", "gigabytes"), "gb"),
    **dict.fromkeys(("tb", "terabyte", "terabytes"), "tb"),
}
_DATES = frozenset("""january february march april may june july august september october november
december monday tuesday wednesday thursday friday saturday sunday today tomorrow yesterday""".split())
# Capitalized words that are no names: how questions and instructions begin.
_NOT_NAMES = frozenset("""a an the i i'm i'd i've what what's whats which who whom whose where when why
how is are was were do does did can could would should will shall may might must please tell give
show list name explain describe define write translate convert summarize summarise calculate
compute find help let lets let's if in on at for of to from by with and or but so my me we our you
your it its this that these those there here hi hello hey thanks thank ok okay yes""".split())


def _fold(word: str) -> str:
    return word.lower().replace("’", "'").replace("'", "")


def guard_terms(text: str) -> frozenset[str]:
    """Numbers, negation, units, dates and names in ``text``, normalized: two questions whose
    guard terms differ are never the same question, however close their embeddings."""
    terms = {"n:" + m.group().replace(",", "").rstrip("%") + ("%" if m.group().endswith("%") else "")
             for m in _NUMBER.finditer(text)}
    for m in _WORD.finditer(text):
        word = m.group()
        folded = _fold(word)
        if folded in _NEGATIONS:
            terms.add("neg")
        elif folded in _UNITS and (len(folded) > 2 or _follows_number(text, m.start())):
            terms.add("u:" + _UNITS[folded])
        elif folded in _DATES:
            terms.add("d:" + folded)
        elif word[0].isupper() and folded not in _NOT_NAMES:
            terms.add("e:" + (folded[:-1] if folded.endswith("s") and word.endswith(("'s", "’s")) else folded))
    for symbol in ("°c", "°f", "$", "€"):
        if symbol in text.lower():
            terms.add("u:" + _UNITS[symbol])
    return frozenset(terms)


def _follows_number(text: str, start: int) -> bool:
    """A one- or two-letter unit ("m", "in", "kg") only counts after a number: "in" is a preposition."""
    before = text[:start].rstrip()
    return bool(before) and before[-1].isdigit()


# ---------------------------------------------------------------------------------------------
# The cache: index + log stream + answers in the shared store


@dataclass(frozen=True)
class Lookup:
    state: str  # HIT (semantic), MISS or BYPASS
    body: bytes | None = None
    score: float | None = None
    vector: np.ndarray | None = None  # the question's embedding, for storing the answer on a miss


class SemanticCache:
    def __init__(self, redis: Any, answers: SharedResponseCache, embedder: Embedder, prefix: str, region: str, *,
                 max_entries: int = 10_000, ttl_s: float = 600.0, retry_s: float = 1.0) -> None:
        self.redis = redis
        self.answers = answers
        self.embedder = embedder
        self.index = SemanticIndex(max_entries)
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self.log_key = f"{prefix}scache:{region}:log"
        self._last_id = "0-0"
        self._tail: asyncio.Task | None = None
        self.synced = asyncio.Event()  # the log was replayed once

    async def start(self) -> None:
        # The model loads once a tenant opts in (``wanted``): an edge whose tenants do not use the
        # semantic cache never pays its memory or start-up time.
        self._tail = asyncio.create_task(self._follow())

    def wanted(self) -> None:
        self.embedder.start()

    async def stop(self) -> None:
        if self._tail is not None:
            self._tail.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._tail
        self.embedder.close()

    def _apply(self, entry_id: bytes | str, fields: dict[bytes, bytes]) -> None:
        self._last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        op = fields.get(b"op", b"add")
        tenant = fields.get(b"tenant", b"").decode()
        if op == b"purge":
            self.index.remove_tenant(tenant)
            return
        try:
            expires_at = float(fields[b"exp"])
            if expires_at <= time.time():
                return
            question = fields[b"q"].decode()
            vector = np.frombuffer(fields[b"vec"], dtype=np.float32)
            self.index.add(Entry(fields[b"id"].decode(), tenant, fields[b"scope"].decode(), question,
                                 vector, guard_terms(question), expires_at))
        except (KeyError, ValueError) as exc:
            log.warning("skipping a malformed semantic cache record: %r", exc)

    async def _follow(self) -> None:
        """Replay the region's log, then tail it; after a Redis failure, resume where it stopped."""
        late = 0  # tailing reads in a row that outlived the socket timeout
        while True:
            try:
                while True:
                    # Blocks for less than the edge's Redis socket timeout (0.5 s), which would
                    # otherwise count every quiet second as a failure.
                    try:
                        batch = await self.redis.xread({self.log_key: self._last_id}, count=1000,
                                                       block=None if not self.synced.is_set() else FOLLOW_BLOCK_MS)
                    except (RedisTimeout, TimeoutError) as exc:
                        # A quiet tail whose answer came back late (a busy event loop, a busy
                        # machine) is not an outage; a Redis that stays silent read after read is.
                        late += 1
                        if not self.synced.is_set() or late >= FOLLOW_LATE_READS:
                            raise
                        log.debug("semantic cache log read came back late (%d in a row): %r", late, exc)
                        continue
                    late = 0
                    if not batch:
                        self.synced.set()
                        continue
                    for _, records in batch:
                        for entry_id, fields in records:
                            self._apply(entry_id, fields)
                    if not self.synced.is_set() and len(batch[0][1]) < 1000:
                        self.synced.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: lookups bypass meanwhile
                late = 0
                log.warning("semantic cache log unavailable, retrying in %.1fs: %r", self.retry_s, exc)
                await asyncio.sleep(self.retry_s)

    @property
    def usable(self) -> bool:
        return self.embedder.ready and self.answers.usable and self.synced.is_set()

    async def lookup(self, tenant_id: str, scope: str, question: str, threshold: float) -> Lookup:
        if not self.usable:
            return Lookup(BYPASS)
        vector = await self.embedder.encode(question)
        if vector is None:
            return Lookup(BYPASS)
        found = self.index.search(scope, vector, guard_terms(question), threshold, time.time())
        if found is None:
            return Lookup(MISS, vector=vector)
        entry, score = found
        state, body = await self.answers.lookup(BODY_PREFIX + entry.id, tenant_id)
        if state == HIT:
            return Lookup(HIT, body, score)
        if state == MISS:  # the answer expired or was evicted before the index heard of it
            self.index.remove(entry.id)
        return Lookup(state, vector=vector)

    async def store(self, tenant_id: str, scope: str, question: str, vector: np.ndarray, body: bytes) -> None:
        entry_id = uuid.uuid4().hex
        expires_at = time.time() + self.ttl_s
        if not await self.answers.store(BODY_PREFIX + entry_id, body, tenant_id):
            return
        try:
            await self.redis.xadd(self.log_key, {"op": "add", "id": entry_id, "tenant": tenant_id, "scope": scope,
                                                 "q": question, "vec": vector.astype(np.float32).tobytes(),
                                                 "exp": f"{expires_at:.3f}"},
                                  maxlen=self.max_entries, approximate=True)
        except Exception as exc:  # not stored, never an error
            log.warning("semantic cache store failed: %r", exc)
            return
        # Searchable here at once; the tail sees the record again and keeps one copy (by id).
        self.index.add(Entry(entry_id, tenant_id, scope, question, vector, guard_terms(question), expires_at))
