"""The model name a client asked for, echoed in every response.

Engines answer with their served name (``llama-fp8``); OpenAI's clients expect the ``model`` they
sent (``llama-3.1-8b`` or ``llama-3.1-8b:fp8``), and internal names should not leak. Engines write
compact JSON (SGLang: orjson for bodies, pydantic's ``model_dump_json`` for stream chunks; the
simulator: msgspec), so the field is rewritten as bytes, without decoding a body or an event: one
C-speed ``bytes.replace`` per chunk, and none when the two names are equal."""

from __future__ import annotations

import msgspec


def model_rewrite(served: str, requested: str) -> tuple[bytes, bytes] | None:
    """The (served, requested) ``"model":"..."`` byte pair to swap, or None when there is nothing to do."""
    if served == requested:
        return None
    encode = msgspec.json.encode
    return b'"model":' + encode(served), b'"model":' + encode(requested)


def echo(data: bytes, rewrite: tuple[bytes, bytes] | None) -> bytes:
    return data if rewrite is None else data.replace(rewrite[0], rewrite[1])
