"""Request parsing and response shapes, as SGLang's HTTP server and OpenAI adapters emit them.

Pure functions over dicts: the server module does the I/O.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from . import structured, tokenizer
from .engine import SimRequest


class BadRequest(ValueError):
    pass


class ValidationFailed(BadRequest):
    """A field of the wrong type: SGLang's FastAPI/pydantic layer rejects it before any handler runs,
    with 400 and the flat ErrorResponse whose ``type`` is ``"Bad Request"``."""


class InternalError(Exception):
    """What SGLang answers 500 to: its native ``/generate`` only turns ValueErrors into 400, and a
    sampling parameter of the wrong shape raises a TypeError while SamplingParams is built."""


@dataclass
class GenerationSpec:
    """What the engine needs for one request, whichever API it came through."""

    prompt_ids: list[int]
    max_new_tokens: int | None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    seed: int | None = None
    priority: int | None = None
    forced: list[str] | None = None  # constrained output pieces (structured.Constraint)


@dataclass(frozen=True)
class OpenAIOptions:
    """What an OpenAI response needs besides the engine's output: the echo fields, ``n``, the
    log-probabilities asked for (None: none), and the constraint per choice (a tool call or a
    JSON format)."""

    model: str
    stream: bool
    include_usage: bool
    n: int = 1
    logprobs: int | None = None  # chat: top_logprobs (0 with plain logprobs); completions: logprobs
    constraints: tuple[structured.Constraint | None, ...] = (None,)


def _stop_list(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v)
    raise BadRequest("stop must be a string or a list of strings")


def _native_stop_token_ids(value) -> frozenset[int]:
    """``sampling_params.stop_token_ids`` on /generate: SGLang builds a set from it, so a value that
    is not iterable (or holds non-integers) fails inside the engine, not in validation."""
    if not value:
        return frozenset()
    try:
        return frozenset(int(t) for t in value if t is not None)
    except (TypeError, ValueError) as exc:
        raise InternalError(f"stop_token_ids: {exc}") from exc


def _openai_stop_token_ids(value) -> frozenset[int]:
    """``stop_token_ids`` on the OpenAI endpoints is typed ``Optional[List[int]]`` in SGLang's protocol
    models, so pydantic rejects anything else with a 400."""
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ValidationFailed(f"stop_token_ids: Input should be a valid list of integers, got {value!r}")
    return frozenset(value)


_TRUE, _FALSE = {"1", "on", "t", "true", "y", "yes"}, {"0", "off", "f", "false", "n", "no"}


def lax_bool(value, name: str) -> bool:
    """A boolean field the way pydantic's lax mode (SGLang's request validation) reads it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise ValidationFailed(f"{name}: Input should be a valid boolean, got {value!r}")


def lax_int(value, name: str) -> int:
    """An integer field the way pydantic's lax mode reads it (``5``, ``"5"``, ``5.0``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValidationFailed(f"{name}: Input should be a valid integer, got {value!r}")


def priority_field(body: dict) -> int | None:
    """``priority`` (native and OpenAI): an integer or null; the engine ignores it unless
    ``--enable-priority-scheduling``."""
    value = body.get("priority")
    return None if value is None else lax_int(value, "priority")


def _int_or_none(value, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer")
    return value


# -- native /generate -------------------------------------------------------------------------
def parse_generate(body: dict) -> list[GenerationSpec]:
    """``text`` or ``input_ids`` (single or batch) with SGLang ``sampling_params``."""
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise BadRequest("Either text or input_ids should be provided.")
    if text is not None:
        texts = text if isinstance(text, list) else [text]
        if not all(isinstance(t, str) for t in texts):
            raise BadRequest("text must be a string or a list of strings")
        prompts = [tokenizer.encode(t) for t in texts]
    else:
        batch = input_ids and isinstance(input_ids[0], list)
        prompts = input_ids if batch else [input_ids]
        if not all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompts):
            raise BadRequest("input_ids must be a list of integers or a list of such lists")
    max_new = _int_or_none(params.get("max_new_tokens", 128), "max_new_tokens")
    stop = _stop_list(params.get("stop"))
    stop_ids = _native_stop_token_ids(params.get("stop_token_ids"))
    ignore_eos = bool(params.get("ignore_eos", False))
    seed = _int_or_none(params.get("sampling_seed"), "sampling_seed")
    priority = priority_field(body)
    if body.get("stream") is not None:
        body["stream"] = lax_bool(body["stream"], "stream")
    return [GenerationSpec(p, max_new, stop, stop_ids, ignore_eos, seed, priority) for p in prompts]


def is_batch(body: dict) -> bool:
    text, ids = body.get("text"), body.get("input_ids")
    return isinstance(text, list) or bool(ids and isinstance(ids[0], list))


def generate_payload(req: SimRequest, output_ids: list[int] | None = None, text: str | None = None) -> dict:
    """One /generate result (or one streamed event: cumulative text, finish_reason null until last)."""
    now_done = req.finished_at if req.finish_reason else None
    return {
        "text": req.text() if text is None else text,
        "output_ids": list(req.output_ids) if output_ids is None else output_ids,
        "meta_info": {
            "id": req.rid,
            "finish_reason": req.finish_reason,
            "prompt_tokens": len(req.prompt_ids),
            "weight_version": "default",
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "e2e_latency": (now_done - req.arrival) if now_done is not None else None,
        },
    }


# -- OpenAI ------------------------------------------------------------------------------------
def choice_seed(seed: int | None, index: int) -> int | None:
    """The sampling seed of choice ``index`` of an ``n > 1`` request: choices differ, and each is
    reproducible with the request's seed."""
    return seed if index == 0 else (seed or 0) ^ (index * 0x9E3779B1)


def parse_openai(body: dict, chat: bool, engine_seed: int = 0) -> tuple[list[GenerationSpec], OpenAIOptions]:
    """One spec per choice (``n``) and the options a response needs."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(messages))
        max_new = _int_or_none(body.get("max_completion_tokens", body.get("max_tokens")), "max_tokens")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise BadRequest("prompt must be a string or a list of token ids")
        max_new = _int_or_none(body.get("max_tokens", 16), "max_tokens")
    n = _int_or_none(body.get("n"), "n") or 1
    if n < 1:
        raise BadRequest("n must be at least 1")
    if chat:
        logprobs = (_int_or_none(body.get("top_logprobs"), "top_logprobs") or 0) if body.get("logprobs") else None
    else:
        logprobs = _int_or_none(body.get("logprobs"), "logprobs")
    stream_options = body.get("stream_options") or {}
    seed = _int_or_none(body.get("seed"), "seed")
    specs, constraints = [], []
    for index in range(n):
        constraint = structured.constraint_for(body, engine_seed ^ (choice_seed(seed, index) or 0), prompt_ids)
        constraints.append(constraint)
        specs.append(GenerationSpec(
            prompt_ids=prompt_ids,
            max_new_tokens=max_new,
            stop=_stop_list(body.get("stop")),
            stop_token_ids=_openai_stop_token_ids(body.get("stop_token_ids")),
            ignore_eos=bool(body.get("ignore_eos", False)),
            seed=choice_seed(seed, index),
            priority=priority_field(body),
            forced=constraint.pieces() if constraint is not None else None,
        ))
    options = OpenAIOptions(
        model=body.get("model") or "default",
        stream=bool(body.get("stream", False)),
        include_usage=bool(stream_options.get("include_usage", False)),
        n=n, logprobs=logprobs, constraints=tuple(constraints),
    )
    return specs, options


def openai_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(reqs: SimRequest | list[SimRequest]) -> dict:
    """One request's usage, or an ``n > 1`` request's: the prompt once (SGLang counts it once), the
    completions summed."""
    reqs = [reqs] if isinstance(reqs, SimRequest) else reqs
    prompt, completion = len(reqs[0].prompt_ids), sum(len(r.output_ids) for r in reqs)
    cached = reqs[0].cached_tokens
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        # SGLang (usage_processor.py): details only when cached tokens > 0, else null. It also needs
        # --enable-cache-report; the simulator reports without it (a documented deviation: benches
        # that start simulators directly read the hit rate from here).
        "prompt_tokens_details": {"cached_tokens": cached} if cached > 0 else None,
    }


def tool_call_id(req: SimRequest) -> str:
    return "call_" + uuid.uuid5(uuid.NAMESPACE_OID, req.rid).hex[:24]


def answers_with_tool_call(req: SimRequest, constraint: structured.Constraint | None, finish: str | None) -> bool:
    """Does this choice answer with a tool call? Only a complete one: a call cut by max_tokens is
    not parseable, and SGLang's parser then leaves the text as content."""
    return constraint is not None and constraint.kind == "tool_call" and finish == "stop"


def choice_logprobs(req: SimRequest, chat: bool, top: int | None, start: int = 0, end: int | None = None,
              text_offset: int = 0) -> dict | None:
    if top is None:
        return None
    pieces, ids = req.pieces[start:end], req.output_ids[start:end]
    if ids and ids[-1] == tokenizer.EOS_TOKEN_ID and req.done:  # the end of sequence is not a token shown
        pieces, ids = pieces[:-1], ids[:-1]
    if chat:
        return structured.chat_logprobs(pieces, ids, start, top)
    return structured.completion_logprobs(pieces, ids, start, top, text_offset)


def openai_finish(req: SimRequest) -> tuple[str | None, object]:
    reason = req.finish_reason
    if reason is None:
        return None, None
    return reason["type"], reason.get("matched")


def openai_response(reqs: SimRequest | list[SimRequest], cid: str, model: str, chat: bool, created: int,
                    options: OpenAIOptions | None = None) -> dict:
    reqs = [reqs] if isinstance(reqs, SimRequest) else reqs
    options = options or OpenAIOptions(model, False, False)
    choices = []
    for index, req in enumerate(reqs):
        finish, matched = openai_finish(req)
        text = req.text()
        constraint = options.constraints[index] if index < len(options.constraints) else None
        logprobs = choice_logprobs(req, chat, options.logprobs)
        if chat:
            message: dict = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
            if answers_with_tool_call(req, constraint, finish):
                assert constraint is not None
                message["content"] = None
                message["tool_calls"] = [{"id": tool_call_id(req), "index": 0, "type": "function",
                                          "function": {"name": constraint.tool, "arguments": text}}]
                finish = "tool_calls"
            choices.append({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish,
                            "matched_stop": matched})
        else:
            choices.append({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
                            "matched_stop": matched})
    return {
        "id": cid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(reqs),
    }


def openai_chunk(cid: str, model: str, chat: bool, created: int, delta: str | None, req: SimRequest | None,
                 first: bool = False, final: bool = False, index: int = 0, logprobs: dict | None = None,
                 tool_calls: list[dict] | None = None, finish: str | None = None) -> dict:
    matched = None
    if final and req is not None:
        reason, matched = openai_finish(req)
        finish = finish or reason
    if chat:
        content: dict = {}
        if first:
            content["role"] = "assistant"
        if delta is not None:
            content["content"] = delta
        if tool_calls is not None:
            content["tool_calls"] = tool_calls
        choice = {"index": index, "delta": content, "logprobs": logprobs, "finish_reason": finish,
                  "matched_stop": matched}
    else:
        choice = {"index": index, "text": delta or "", "logprobs": logprobs, "finish_reason": finish,
                  "matched_stop": matched}
    return {
        "id": cid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def openai_usage_chunk(cid: str, model: str, chat: bool, created: int, req: SimRequest | list[SimRequest]) -> dict:
    return {
        "id": cid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(req),
    }


def openai_error(message: str, status: int, err_type: str = "BadRequestError") -> dict:
    """SGLang's OpenAI adapters answer errors with this flat ErrorResponse body (``type`` is
    ``BadRequestError`` from a handler, ``"Bad Request"`` from request validation)."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def now_seconds() -> int:
    return int(time.time())
