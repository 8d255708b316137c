"""Request validation: size, nesting, schema, and the facts routing and limits need (prompt text,
token estimate).

Pure functions; the caller turns ``EdgeError`` into an OpenAI-style 400. Whatever a client sends,
the answer is a 4xx naming the ``param`` at fault, never a 5xx: a field outside OpenAI's and SGLang's
documented ones is refused, and every field the edge or an engine reads is checked here for its type
and OpenAI's (or SGLang's) bounds (``structured`` does tools, tool_choice, response_format and
logprobs); meaning beyond that is the engine's to judge, and an engine's 4xx reaches the client as
such."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from dataplane.edge import errors, structured
from dataplane.edge.catalog import BATCH, INTERACTIVE, PRIORITIES

CHAT = "chat"
COMPLETION = "completion"
EMBEDDING = "embedding"
# The one table of inference endpoints: app.py routes by it, the service forwards to the same path.
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
DEFAULT_MAX_TOKENS = 256
# Request fields that are edge-only and must not reach the engine.
EDGE_ONLY_FIELDS = ("priority",)
MAX_JSON_DEPTH = 64
MAX_MODEL_NAME = 256
MAX_TOKENS_CAP = 2**31 - 1


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
    longest_input_tokens: int = 0  # embeddings: the largest input's estimate (each must fit the context)

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


def parse_json(raw: bytes, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """The body as a JSON object, or a 413 (size) / 400 (not JSON, not an object, nested deeper
    than ``max_depth``). Nesting is checked before any other work looks at the body."""
    if len(raw) > max_bytes:
        raise errors.EdgeError(413, f"Request body is larger than {max_bytes} bytes.", code="request_too_large")
    try:
        body = msgspec.json.decode(raw)
    except RecursionError:  # msgspec's own bound (the interpreter's recursion limit)
        raise _too_deep(max_depth) from None
    except msgspec.DecodeError as exc:
        raise errors.bad_request(f"The body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise errors.bad_request("The body must be a JSON object.", code="invalid_json")
    # A body with fewer brackets than the bound cannot nest past it: the common case costs two
    # C-speed scans and no walk.
    if max_depth and raw.count(b"{") + raw.count(b"[") > max_depth and json_depth(body, max_depth) > max_depth:
        raise _too_deep(max_depth)
    return body


def _too_deep(max_depth: int) -> errors.EdgeError:
    return errors.bad_request(f"The body nests JSON deeper than {max_depth} levels.", code="json_too_deep")


def json_depth(obj: Any, stop_past: int) -> int:
    """Nesting depth of decoded JSON (a scalar is 0, ``{}`` is 1), without recursion; stops as soon
    as it passes ``stop_past``."""
    deepest = 0
    stack = [(obj, 1)] if isinstance(obj, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > stop_past:
                return deepest
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return deepest


def _kind(value: Any) -> str:
    """How an error message names a value it got: a short repr for scalars, the type otherwise."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "...")
    if value is None or isinstance(value, bool | int | float):
        text = repr(value)
        return text if len(text) <= 40 else text[:40] + "..."
    return "an object" if isinstance(value, dict) else "an array"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_text(v: Any) -> bool:
    return isinstance(v, str)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_object_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, dict) for t in v)


_BOOL, _INT, _NUM, _STR = "a boolean", "an integer", "a number", "a string"
# The types of the optional fields engines read (OpenAI's and SGLang's extras).
OPTIONAL_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "stop": (lambda v: isinstance(v, str) or _is_str_list(v), "a string or an array of strings"),
    "stop_token_ids": (lambda v: isinstance(v, list) and all(_is_int(x) for x in v), "an array of integers"),
    "seed": (_is_int, _INT),
    "user": (_is_text, _STR),
    "top_k": (_is_int, _INT),
    "min_p": (_is_num, _NUM),
    "repetition_penalty": (_is_num, _NUM),
    "min_tokens": (_is_int, _INT),
    "best_of": (_is_int, _INT),
    "logit_bias": (lambda v: isinstance(v, dict) and all(_is_num(x) for x in v.values()),
                   "an object of token ids to numbers"),
    "suffix": (_is_text, _STR),
    "regex": (_is_text, _STR),
    "ebnf": (_is_text, _STR),
    "json_schema": (_is_text, _STR),
    "metadata": (lambda v: isinstance(v, dict), "an object"),
    "modalities": (_is_str_list, "an array of strings"),
    **{name: (_is_bool, _BOOL) for name in ("ignore_eos", "skip_special_tokens", "echo", "parallel_tool_calls",
                                           "no_stop_trim", "continue_final_message", "separate_reasoning",
                                           "store")},
}
# Every field a request may carry; anything else is a 400 naming it, as OpenAI answers ("Unrecognized
# request argument supplied"). SGLang's own models ignore unknown fields, so without this a typo'd
# parameter would silently do nothing.
OPENAI_CHAT_FIELDS = frozenset({
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
    "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
    "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
    "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
})
OPENAI_COMPLETION_FIELDS = frozenset({
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
})
# SGLang's documented sampling and output extras (its ChatCompletionRequest / CompletionRequest in
# python/sglang/srt/entrypoints/openai/protocol.py), forwarded as they are. Deliberately not among
# them: fields that reach into the engine's internals or another tenant's requests (``rid``,
# ``bootstrap_*``, ``routed_dp_rank``, ``custom_logit_processor``, ``lora_path``, ``session_*``,
# ``return_hidden_states``, ``input_ids``); an operator can allow more with ``extra_request_fields``.
SGLANG_EXTRA_FIELDS = frozenset({
    "top_k", "min_p", "min_tokens", "regex", "ebnf", "json_schema", "repetition_penalty", "stop_token_ids",
    "stop_regex", "no_stop_trim", "ignore_eos", "continue_final_message", "skip_special_tokens",
    "separate_reasoning", "stream_reasoning", "chat_template_kwargs", "response_format",
})
OPENAI_EMBEDDING_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
KNOWN_FIELDS = {
    CHAT: OPENAI_CHAT_FIELDS | SGLANG_EXTRA_FIELDS | frozenset(EDGE_ONLY_FIELDS),
    COMPLETION: OPENAI_COMPLETION_FIELDS | SGLANG_EXTRA_FIELDS | frozenset(EDGE_ONLY_FIELDS),
    EMBEDDING: OPENAI_EMBEDDING_FIELDS | frozenset(EDGE_ONLY_FIELDS),
}
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit per request

MESSAGE_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (_is_text, _STR),
    "tool_call_id": (_is_text, _STR),
    "tool_calls": (_is_object_list, "an array of objects"),
}


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise errors.bad_request(f"{where}[{i}] must be an object with a string `type`.",
                                         param=f"{where}[{i}]")
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    raise errors.bad_request(f"{where}[{i}].text must be a string.", param=f"{where}[{i}].text")
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
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise errors.bad_request(
                f"{where}.role must be one of {sorted(CHAT_ROLES)}, got {_kind(role)}.", param=f"{where}.role")
        if "content" not in msg and role != "assistant":
            raise errors.bad_request(f"{where}.content is required.", param=f"{where}.content")
        if len(msg) > 2:
            for name, value in msg.items():
                found = MESSAGE_FIELDS.get(name)
                if found is not None and value is not None and not found[0](value):
                    raise errors.bad_request(f"{where}.{name} must be {found[1]}, got {_kind(value)}.",
                                             param=f"{where}.{name}")
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
    if isinstance(prompt, list) and prompt and all(_is_int(p) for p in prompt):
        return " ".join(map(str, prompt))
    raise errors.bad_request("`prompt` must be a non-empty string.", param="prompt")


def _number(body: dict[str, Any], name: str, lo: float, hi: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if not _is_num(value) or not lo <= value <= hi:
        raise errors.bad_request(f"`{name}` must be a number between {lo} and {hi}.", param=name)


def validate(kind: str, body: dict[str, Any], estimator: TokenEstimator, *, max_messages: int = 2048,
             max_n: int = 8, extra_fields: frozenset[str] = frozenset()) -> InferenceRequest:
    known = KNOWN_FIELDS[kind]
    for name in body:
        if name not in known and name not in extra_fields:
            raise errors.bad_request(f"Unrecognized request argument supplied: {name}",
                                     param=name if len(name) <= 64 else name[:64] + "...",
                                     code="unrecognized_argument")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise errors.bad_request("`model` is required and must be a string.", param="model")
    if len(model) > MAX_MODEL_NAME:
        raise errors.bad_request(f"`model` is longer than {MAX_MODEL_NAME} characters.", param="model")
    if kind == EMBEDDING:
        return _embedding_request(body, model, estimator)
    if kind == CHAT:
        prompt_text = chat_prompt_text(body.get("messages"), max_messages)
    else:
        prompt_text = completion_prompt_text(body.get("prompt"))
    tokens_field = "max_tokens"
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    else:
        tokens_field = "max_completion_tokens"
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    elif type(max_tokens) is not int or not 1 <= max_tokens <= MAX_TOKENS_CAP:  # (a bool is not an int here)
        raise errors.bad_request(f"`{tokens_field}` must be a positive integer.", param=tokens_field)
    for name, value in body.items():  # a request has a handful of fields; the table has dozens
        found = OPTIONAL_FIELDS.get(name)
        if found is not None and value is not None and not found[0](value):
            raise errors.bad_request(f"`{name}` must be {found[1]}, got {_kind(value)}.", param=name)
    structured.check_logprobs(body, kind == CHAT)
    structured.check_response_format(body.get("response_format"))
    if kind == CHAT:
        structured.check_tool_choice(body.get("tool_choice"), structured.check_tools(body.get("tools")))
        prompt_text = structured.tools_text(body.get("tools")) + prompt_text
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _number(body, "presence_penalty", -2, 2)
    _number(body, "frequency_penalty", -2, 2)
    _number(body, "min_p", 0, 1)  # SGLang's own bounds for its extras
    _number(body, "repetition_penalty", 0, 2)
    top_k = body.get("top_k")
    if top_k is not None and (top_k == 0 or top_k < -1):  # (its type is checked above)
        raise errors.bad_request("`top_k` must be -1 (off) or a positive integer.", param="top_k")
    if body.get("min_tokens") is not None and body["min_tokens"] < 0:
        raise errors.bad_request("`min_tokens` must not be negative.", param="min_tokens")
    seed = body.get("seed")
    if seed is not None and not -2**63 <= seed < 2**63:
        raise errors.bad_request("`seed` must fit in a signed 64-bit integer.", param="seed")
    n = body.get("n", 1)
    if type(n) is not int or not 1 <= n <= max_n:
        raise errors.bad_request(f"`n` must be an integer between 1 and {max_n}.", param="n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise errors.bad_request("`stream` must be a boolean.", param="stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise errors.bad_request("`stream_options` must be an object.", param="stream_options")
    if opts and opts.get("include_usage") is not None and not isinstance(opts["include_usage"], bool):
        raise errors.bad_request("`stream_options.include_usage` must be a boolean.",
                                 param="stream_options.include_usage")
    include_usage = bool(stream and opts and opts.get("include_usage"))
    priority = _priority(body)
    temperature = body.get("temperature", 1.0)
    # What the response caches may answer: one choice, and greedy decoding or a fixed seed (the
    # same seed asks for the same sample, so a cached one is a valid answer).
    deterministic = n == 1 and (temperature == 0 or body.get("top_k") == 1 or body.get("seed") is not None)
    return InferenceRequest(
        kind=kind, body=body, model=model, prompt_text=prompt_text,
        prompt_tokens_est=estimator.estimate(prompt_text), max_tokens=max_tokens * n, stream=stream,
        include_usage=include_usage, priority=priority, deterministic=deterministic,
    )


def _priority(body: dict[str, Any]) -> str | None:
    """The edge's own ``priority`` field: a class name, or absent."""
    priority = body.get("priority")
    if priority is not None and (not isinstance(priority, str) or priority not in PRIORITIES):
        raise errors.bad_request(f"`priority` must be one of {list(PRIORITIES)}.", param="priority")
    return priority


def _embedding_request(body: dict[str, Any], model: str, estimator: TokenEstimator) -> InferenceRequest:
    """``/v1/embeddings``: ``input`` is a string, strings, token ids or lists of token ids (OpenAI's
    shapes, at most 2048 inputs); ``encoding_format`` float or base64; ``dimensions`` positive."""
    value = body.get("input")
    if isinstance(value, str) or (isinstance(value, list) and value and all(_is_int(t) for t in value)):
        items: list[Any] = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise errors.bad_request("`input` must be a non-empty string, array of strings, or array of token ids.",
                                 param="input")
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise errors.bad_request(f"At most {MAX_EMBEDDING_INPUTS} inputs are allowed per request.", param="input")
    sizes, texts = [], []
    for i, item in enumerate(items):
        if isinstance(item, str) and item:
            texts.append(item)
            sizes.append(estimator.estimate(item))
        elif isinstance(item, list) and item and all(_is_int(t) and t >= 0 for t in item):
            texts.append(" ".join(map(str, item)))
            sizes.append(len(item))
        else:
            raise errors.bad_request(f"`input[{i}]` must be a non-empty string or array of token ids.",
                                     param=f"input[{i}]" if len(items) > 1 or not isinstance(value, str) else "input")
    fmt = body.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        raise errors.bad_request("`encoding_format` must be 'float' or 'base64'.", param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise errors.bad_request("`dimensions` must be a positive integer.", param="dimensions")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise errors.bad_request("`user` must be a string.", param="user")
    priority = _priority(body)
    return InferenceRequest(
        kind=EMBEDDING, body=body, model=model, prompt_text=texts[0], prompt_tokens_est=sum(sizes), max_tokens=0,
        stream=False, include_usage=False, priority=priority, deterministic=True, longest_input_tokens=max(sizes),
    )


def check_context(req: InferenceRequest, context_length: int) -> None:
    """max_tokens must fit next to the prompt in the variant's context window."""
    if context_length <= 0:
        return
    if req.kind == EMBEDDING:  # every input on its own must fit the context
        if req.longest_input_tokens > context_length * 1.1:
            raise errors.bad_request(
                f"An input needs about {req.longest_input_tokens} tokens; the model's context length is "
                f"{context_length}.", param="input", code="context_length_exceeded")
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


# SGLang's integer priority per class, by the engine's ordering: interactive work runs first. The gap
# is above SGLang's --priority-scheduling-preemption-threshold (10 by default), so an interactive
# request also preempts a running batch one when the engine's batch is full.
ENGINE_PRIORITY = {"high_first": {INTERACTIVE: 100, BATCH: 0}, "low_first": {INTERACTIVE: 0, BATCH: 100}}


def upstream_body(req: InferenceRequest, served_model_name: str, priority: str = INTERACTIVE,
                  priority_scheduling: str | None = None) -> bytes:
    """What the engine receives: the served model name, usage always on for metering, edge fields
    gone, and the request's class as SGLang's ``priority`` where the engine schedules by it (batch
    requests then yield inside the engine too)."""
    body = dict(req.body)
    body["model"] = served_model_name
    for name in EDGE_ONLY_FIELDS:
        body.pop(name, None)
    order = ENGINE_PRIORITY.get(priority_scheduling or "")
    if order is not None:
        body["priority"] = order.get(priority, order[INTERACTIVE])
    if req.stream:
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts
    return msgspec.json.encode(body)
