"""Request validation: size, schema, and the facts routing and limits need (prompt text, token estimate).

Pure functions; the caller turns ``EdgeError`` into an OpenAI-style 400."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from dataplane.edge import errors
from dataplane.edge.catalog import PRIORITIES

CHAT = "chat"
COMPLETION = "completion"
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
DEFAULT_MAX_TOKENS = 256
# Request fields that are edge-only and must not reach the engine.
EDGE_ONLY_FIELDS = ("priority",)


@dataclass(slots=True)
class InferenceRequest:
    kind: str  # CHAT | COMPLETION
    body: dict[str, Any]
    model: str
    prompt_text: str
    prompt_tokens_est: int
    max_tokens: int
    stream: bool
    include_usage: bool
    priority: str | None
    deterministic: bool

    @property
    def reserved_tokens(self) -> int:
        return self.prompt_tokens_est + self.max_tokens


class TokenEstimator:
    """Characters -> tokens without a tokenizer, calibrated by the prompt_tokens engines report."""

    def __init__(self, chars_per_token: float = 4.0) -> None:
        self.chars_per_token = chars_per_token

    def estimate(self, text: str) -> int:
        return int(len(text) / self.chars_per_token) + 1

    def observe(self, chars: int, tokens: int) -> None:
        if chars > 64 and tokens > 0:
            # slow EWMA so one odd prompt cannot swing routing
            self.chars_per_token += 0.02 * (chars / tokens - self.chars_per_token)


def parse_json(raw: bytes, max_bytes: int) -> dict[str, Any]:
    if len(raw) > max_bytes:
        raise errors.EdgeError(413, f"Request body is larger than {max_bytes} bytes.", code="request_too_large")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise errors.bad_request(f"The body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise errors.bad_request("The body must be a JSON object.", code="invalid_json")
    return body


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or "type" not in part:
                raise errors.bad_request(f"{where}[{i}] must be an object with a `type`.", param=where)
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    raise errors.bad_request(f"{where}[{i}].text must be a string.", param=where)
                parts.append(part["text"])
        return "".join(parts)
    raise errors.bad_request(f"{where} must be a string or a list of content parts.", param=where)


def chat_prompt_text(messages: Any, max_messages: int) -> str:
    if not isinstance(messages, list) or not messages:
        raise errors.bad_request("`messages` must be a non-empty array.", param="messages")
    if len(messages) > max_messages:
        raise errors.bad_request(f"At most {max_messages} messages are allowed.", param="messages")
    pieces = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise errors.bad_request(f"{where} must be an object.", param=where)
        role = msg.get("role")
        if role not in CHAT_ROLES:
            raise errors.bad_request(
                f"{where}.role must be one of {sorted(CHAT_ROLES)}, got {role!r}.", param=f"{where}.role")
        if "content" not in msg and role != "assistant":
            raise errors.bad_request(f"{where}.content is required.", param=f"{where}.content")
        # The role markers keep two conversations with equal text but different turns apart.
        pieces.append(f"<|{role}|>{_content_text(msg.get('content'), f'{where}.content')}")
    return "\n".join(pieces)


def completion_prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > 1:
            raise errors.bad_request("Batched prompts are not supported; send one prompt per request.",
                                     param="prompt")
        return prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return " ".join(map(str, prompt))
    raise errors.bad_request("`prompt` must be a non-empty string.", param="prompt")


def _number(body: dict[str, Any], name: str, lo: float, hi: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise errors.bad_request(f"`{name}` must be a number between {lo} and {hi}.", param=name)


def validate(kind: str, body: dict[str, Any], estimator: TokenEstimator, *, max_messages: int = 2048,
             max_n: int = 8) -> InferenceRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise errors.bad_request("`model` is required.", param="model")
    if kind == CHAT:
        prompt_text = chat_prompt_text(body.get("messages"), max_messages)
    else:
        prompt_text = completion_prompt_text(body.get("prompt"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise errors.bad_request("`max_tokens` must be a positive integer.", param="max_tokens")
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _number(body, "presence_penalty", -2, 2)
    _number(body, "frequency_penalty", -2, 2)
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_n:
        raise errors.bad_request(f"`n` must be an integer between 1 and {max_n}.", param="n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise errors.bad_request("`stream` must be a boolean.", param="stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise errors.bad_request("`stream_options` must be an object.", param="stream_options")
    include_usage = bool(stream and opts and opts.get("include_usage"))
    priority = body.get("priority")
    if priority is not None and priority not in PRIORITIES:
        raise errors.bad_request(f"`priority` must be one of {list(PRIORITIES)}.", param="priority")
    temperature = body.get("temperature", 1.0)
    deterministic = n == 1 and (temperature == 0 or body.get("top_k") == 1)
    return InferenceRequest(
        kind=kind, body=body, model=model, prompt_text=prompt_text,
        prompt_tokens_est=estimator.estimate(prompt_text), max_tokens=max_tokens * n, stream=stream,
        include_usage=include_usage, priority=priority, deterministic=deterministic,
    )


def check_context(req: InferenceRequest, context_length: int) -> None:
    """max_tokens must fit next to the prompt in the variant's context window."""
    if context_length <= 0:
        return
    if req.max_tokens >= context_length:
        raise errors.bad_request(
            f"`max_tokens` ({req.max_tokens}) must be smaller than the model's context length ({context_length}).",
            param="max_tokens", code="context_length_exceeded")
    if req.prompt_tokens_est + req.max_tokens > context_length * 1.1:
        # 10% slack: the estimate is not a tokenizer, and the engine rejects exact overflows itself.
        raise errors.bad_request(
            f"This request needs about {req.prompt_tokens_est + req.max_tokens} tokens "
            f"(prompt ~{req.prompt_tokens_est} + max_tokens {req.max_tokens}); the model's context length "
            f"is {context_length}.", param="messages" if req.kind == CHAT else "prompt",
            code="context_length_exceeded")


def upstream_body(req: InferenceRequest, served_model_name: str) -> bytes:
    """What the engine receives: the served model name, usage always on for metering, edge fields gone."""
    body = dict(req.body)
    body["model"] = served_model_name
    for name in EDGE_ONLY_FIELDS:
        body.pop(name, None)
    if req.stream:
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts
    return msgspec.json.encode(body)
