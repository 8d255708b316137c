"""``/v1/embeddings`` for a simulator started with ``--is-embedding`` (as SGLang is for embedding
models): deterministic, unit-length vectors of the model profile's hidden size.

A vector is the normalized sum of one pseudo-random direction per input token (seeded by the token
id), so equal texts embed equally and texts that share words point the same way: enough for tests
of anything that compares embeddings (a semantic cache), and cheap. The engine still runs each
input as a prefill with no output token, so timing, KV use and metrics look like SGLang's."""

from __future__ import annotations

import base64
from functools import lru_cache

import numpy as np

from . import tokenizer
from .protocol import BadRequest

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


@lru_cache(maxsize=65_536)
def _direction(token_id: int, dim: int) -> np.ndarray:
    return np.random.default_rng(token_id).standard_normal(dim).astype(np.float32)


def vector(token_ids: list[int], dim: int, dimensions: int | None = None) -> np.ndarray:
    total = np.zeros(dim, dtype=np.float32)
    for token in token_ids:
        total += _direction(token, dim)
    if dimensions is not None:  # Matryoshka-style: the leading components, renormalized
        total = total[:dimensions]
    norm = float(np.linalg.norm(total))
    return total / norm if norm > 0 else total


def parse_inputs(body: dict) -> list[list[int]]:
    """``input`` as SGLang's EmbeddingRequest takes it: a string, strings, token ids, or lists of them."""
    value = body.get("input")
    if isinstance(value, str):
        items: list = [value]
    elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        items = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise BadRequest("input must be a string, a list of strings, or token ids")
    if len(items) > MAX_INPUTS:
        raise BadRequest(f"at most {MAX_INPUTS} inputs per request")
    out = []
    for item in items:
        if isinstance(item, str) and item:
            out.append(tokenizer.encode(item))
        elif isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            out.append(list(item))
        else:
            raise BadRequest("every input must be a non-empty string or a non-empty list of token ids")
    return out


def response(token_lists: list[list[int]], dim: int, model: str, dimensions: int | None, encoding: str) -> dict:
    data = []
    for index, ids in enumerate(token_lists):
        vec = vector(ids, dim, dimensions)
        embedding: list[float] | str = (base64.b64encode(vec.astype("<f4").tobytes()).decode()
                                        if encoding == "base64" else vec.tolist())
        data.append({"object": "embedding", "embedding": embedding, "index": index})
    tokens = sum(len(ids) for ids in token_lists)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}


def options(body: dict, dim: int) -> tuple[int | None, str]:
    dimensions = body.get("dimensions")
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool)
                                   or not 1 <= dimensions <= dim):
        raise BadRequest(f"dimensions must be an integer between 1 and {dim}")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise BadRequest("encoding_format must be 'float' or 'base64'")
    return dimensions, encoding
