"""Constrained output for the simulator: what the "model" writes when a request asks for a tool
call or a JSON schema, and the log-probabilities it reports.

SGLang constrains decoding with a grammar (xgrammar) compiled from the schema; its tool-call parser
then turns the model's call into ``tool_calls``. The simulator needs the observable result only:
output that is valid against the schema, emitted token by token at the timing model's pace, so
that clients, the edge and its metering see what they would see from a real engine. Everything is
a pure function of the request and a seed, so the same request gives the same answer.

Supported JSON Schema: ``type`` (object, array, string, integer, number, boolean, null, or a list
of them), ``properties`` / ``required`` (every listed property is written), ``items``,
``minItems`` / ``maxItems``, ``enum``, ``const``, ``minimum`` / ``maximum``, ``minLength`` /
``maxLength``, ``anyOf`` / ``oneOf`` (the first branch), local ``$ref`` into ``$defs`` /
``definitions``. Anything else yields a string, which a real grammar would reject at compile time;
the simulator documents that instead of guessing."""

from __future__ import annotations

import math
import random
import re
import zlib
from dataclasses import dataclass
from typing import Any

import msgspec

from dataplane.sim import tokenizer

# JSON text split the way a BPE tokenizer roughly splits it: punctuation alone, strings and
# numbers as pieces of at most a few characters.
_JSON_PIECE = re.compile(r'[{}\[\],:]|"|[^"{}\[\],:\\]{1,6}|\\.')
MAX_DEPTH = 6


@dataclass(frozen=True, slots=True)
class Constraint:
    """What a request forces the output to be. ``tool`` is the function name for a tool call (the
    text is then its arguments), None for a response format."""

    kind: str  # "tool_call" | "json"
    text: str
    tool: str | None = None

    def pieces(self) -> list[str]:
        return json_pieces(self.text)


def json_pieces(text: str) -> list[str]:
    pieces = _JSON_PIECE.findall(text)
    assert "".join(pieces) == text, "the piece split must not lose characters"
    return pieces


def _rng(seed: int, prompt_ids: list[int], salt: str) -> random.Random:
    key = zlib.crc32(bytes(str(prompt_ids[-64:]), "ascii") + salt.encode())
    return random.Random((seed << 32) ^ key)


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(tokenizer.OUTPUT_WORDS) for _ in range(rng.randint(low, high)))


def instance(schema: Any, rng: random.Random, root: dict | None = None, depth: int = 0) -> Any:
    """A value valid against ``schema`` (within the subset above), chosen by ``rng``."""
    if not isinstance(schema, dict):
        return _words(rng, 1, 3)
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return instance(target, rng, root, depth + 1) if depth < MAX_DEPTH else None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return instance(schema[key][0], rng, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        if depth >= MAX_DEPTH:
            return {}
        return {name: instance(sub, rng, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        low = int(schema.get("minItems", 1))
        high = max(low, int(schema.get("maxItems", low + 2)))
        if depth >= MAX_DEPTH:
            return []
        return [instance(schema.get("items", {}), rng, root, depth + 1) for _ in range(rng.randint(low, high))]
    if kind == "integer":
        low = math.ceil(schema.get("minimum", 0))
        return rng.randint(low, max(low, math.floor(schema.get("maximum", low + 100))))
    if kind == "number":
        low = float(schema.get("minimum", 0.0))
        return round(rng.uniform(low, max(low, float(schema.get("maximum", low + 100.0)))), 3)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    text = _words(rng, 1, 4)
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    while len(text) < low:
        text += " " + rng.choice(tokenizer.OUTPUT_WORDS)
    return text if high is None else text[: int(high)]


def constraint_for(body: dict, seed: int, prompt_ids: list[int]) -> Constraint | None:
    """The constraint a chat or completion request carries, or None for free text. A tool call is
    forced by ``tool_choice`` "required" or a named function; with "auto" the simulated model
    answers in text (a real one decides; a test that needs a call asks for one)."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if tools and (choice == "required" or isinstance(choice, dict)):
        functions = [t.get("function") or {} for t in tools if isinstance(t, dict)]
        name = choice["function"].get("name") if isinstance(choice, dict) else functions[0].get("name")
        fn = next((f for f in functions if f.get("name") == name), None)
        if fn is not None:
            args = instance(fn.get("parameters") or {"type": "object"}, _rng(seed, prompt_ids, "tool:" + name))
            return Constraint("tool_call", msgspec.json.encode(args).decode(), name)
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema") or {"type": "object"}
        return Constraint("json", msgspec.json.encode(instance(schema, _rng(seed, prompt_ids, "json"))).decode())
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        value = {"answer": _words(_rng(seed, prompt_ids, "json_object"), 2, 6)}
        return Constraint("json", msgspec.json.encode(value).decode())
    return None


# -- log-probabilities --------------------------------------------------------------------------
def token_logprob(token_id: int, position: int) -> float:
    """The chosen token's log-probability: a stable pseudo-random value in (-2.5, 0]."""
    return -round((zlib.crc32(f"{token_id}:{position}".encode()) % 2500) / 1000.0, 3)


def alternatives(token_id: int, position: int, k: int, piece: str) -> list[tuple[str, float]]:
    """The ``k`` most likely tokens at a position, most likely first: the chosen one, then others
    less likely than it (a real sampler may pick a lower one; greedy decoding never does)."""
    chosen = token_logprob(token_id, position)
    rng = random.Random(zlib.crc32(f"alt:{token_id}:{position}".encode()))
    out = [(piece, chosen)]
    value = chosen
    while len(out) < k:
        value -= 0.1 + rng.random()
        out.append((" " + rng.choice(tokenizer.OUTPUT_WORDS), round(value, 3)))
    return out[:k]


def chat_logprobs(pieces: list[str], ids: list[int], start: int, top: int) -> dict:
    """OpenAI's chat ``logprobs`` object for the tokens at ``start`` onwards."""
    content = []
    for offset, (piece, tid) in enumerate(zip(pieces, ids, strict=True)):
        pos = start + offset
        alts = alternatives(tid, pos, max(1, top), piece)
        content.append({"token": piece, "logprob": token_logprob(tid, pos), "bytes": list(piece.encode()),
                        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}
                                         for t, lp in alts[:top]]})
    return {"content": content}


def completion_logprobs(pieces: list[str], ids: list[int], start: int, top: int, text_offset: int) -> dict:
    """The completions API's ``logprobs`` object (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens, lps, tops, offsets = [], [], [], []
    at = text_offset
    for offset, (piece, tid) in enumerate(zip(pieces, ids, strict=True)):
        pos = start + offset
        tokens.append(piece)
        lps.append(token_logprob(tid, pos))
        tops.append(dict(alternatives(tid, pos, top, piece)) if top else None)
        offsets.append(at)
        at += len(piece)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
