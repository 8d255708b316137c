"""Server-sent events, passed through event by event: never more buffered than one partial event."""

from __future__ import annotations

from typing import Any

import msgspec

from dataplane.edge.errors import error_body

DONE = b"data: [DONE]\n\n"
_USAGE_MARK = b'"usage":'
_NULL_USAGE = (b'"usage":null', b'"usage": null')


class SseSplitter:
    """Cuts a byte stream into complete events (``\\n\\n``-terminated); keeps the partial tail."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._tail + chunk if self._tail else chunk
        if b"\r\n" in data:
            data = data.replace(b"\r\n", b"\n")
        if b"\n\n" not in data:
            self._tail = data
            return []
        parts = data.split(b"\n\n")
        self._tail = parts.pop()
        return [p + b"\n\n" for p in parts if p.strip()]

    @property
    def pending(self) -> bytes:
        return self._tail


def usage_of_event(event: bytes) -> tuple[dict[str, Any] | None, bool]:
    """(usage dict if the event carries one, whether it is the usage-only final chunk)."""
    if _USAGE_MARK not in event or any(m in event for m in _NULL_USAGE):
        return None, False
    payload = event.strip()
    if not payload.startswith(b"data:"):
        return None, False
    try:
        obj = msgspec.json.decode(payload[5:].strip())
    except msgspec.DecodeError:
        return None, False
    if not isinstance(obj, dict) or not isinstance(obj.get("usage"), dict):
        return None, False
    return obj["usage"], obj.get("choices") == []


def is_error_event(event: bytes) -> bool:
    return event.startswith(b'data: {"error"') or event.startswith(b'data:{"error"')


def error_event(message: str, code: str = "upstream_error") -> bytes:
    return b"data: " + error_body(message, "server_error", code) + b"\n\n"


def token_counts(usage: dict[str, Any] | None) -> tuple[int, int, int]:
    """(prompt, completion, cached) from an OpenAI usage object (SGLang puts cached tokens in
    ``prompt_tokens_details.cached_tokens``)."""
    if not usage:
        return 0, 0, 0
    details = usage.get("prompt_tokens_details") or {}
    return (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0))


def carries_output(event: bytes) -> bool:
    """Does this event carry generated output (or end the stream), as opposed to the role-only opening
    chunk an engine sends before prefill? Only called until the first such event."""
    payload = event.strip()
    if not payload.startswith(b"data:"):
        return False
    body = payload[5:].strip()
    if body == b"[DONE]":
        return True
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return True
    if not isinstance(obj, dict):
        return True
    if "error" in obj or obj.get("usage"):
        return True
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            return True
        delta = choice.get("delta") or {}
        if choice.get("text") or choice.get("finish_reason") or delta.get("content") or delta.get("tool_calls"):
            return True
    return False


def replay(body: bytes, chat: bool, include_usage: bool) -> bytes:
    """A whole (cached) answer as the stream a live one would have been: per choice one event with
    its content (chat: role, content, tool calls; completions: text) and one with its finish
    reason, the usage event if the client asked for it, then [DONE]. Same ids, model and shapes."""
    obj = msgspec.json.decode(body)
    base = {"id": obj.get("id"), "object": "chat.completion.chunk" if chat else "text_completion",
            "created": obj.get("created", 0), "model": obj.get("model")}
    events = []
    for choice in obj.get("choices") or ():
        index = choice.get("index", 0)
        if chat:
            message = choice.get("message") or {}
            delta: dict = {"role": "assistant", "content": message.get("content")}
            if message.get("tool_calls"):
                delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(message["tool_calls"])]
            events.append({**base, "choices": [{"index": index, "delta": delta, "logprobs": choice.get("logprobs"),
                                                "finish_reason": None}]})
            events.append({**base, "choices": [{"index": index, "delta": {}, "logprobs": None,
                                                "finish_reason": choice.get("finish_reason")}]})
        else:
            events.append({**base, "choices": [{"index": index, "text": choice.get("text", ""),
                                                "logprobs": choice.get("logprobs"), "finish_reason": None}]})
            events.append({**base, "choices": [{"index": index, "text": "", "logprobs": None,
                                                "finish_reason": choice.get("finish_reason")}]})
    if include_usage and obj.get("usage"):
        events.append({**base, "choices": [], "usage": obj["usage"]})
    return b"".join(b"data: " + msgspec.json.encode(e) + b"\n\n" for e in events) + DONE


def assemble(stream: bytes, usage: dict | None) -> bytes | None:
    """The whole answer a streamed one adds up to, in the non-streamed shape, so that a streamed
    miss can fill the response caches (``replay`` turns it back into a stream). Only what a replay
    reproduces exactly: text content of any number of choices, no tool calls or logprobs; anything
    else (or a stream without its end) gives None and is not cached."""
    first: dict | None = None
    texts: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    for event in stream.split(b"\n\n"):
        if not event.startswith(b"data: ") or event.startswith(b"data: [DONE]"):
            continue
        try:
            obj = msgspec.json.decode(event[6:])
        except msgspec.DecodeError:
            return None
        if not isinstance(obj, dict) or "error" in obj:
            return None
        first = first or obj
        for choice in obj.get("choices") or ():
            index = choice.get("index", 0)
            if choice.get("logprobs"):
                return None
            delta = choice.get("delta")
            if delta is not None and (delta.get("tool_calls") or delta.get("reasoning_content")):
                return None
            piece = (delta or {}).get("content") if delta is not None else choice.get("text")
            texts.setdefault(index, []).append(piece or "")
            if choice.get("finish_reason") is not None:
                finish[index] = choice["finish_reason"]
    if first is None or not texts or set(finish) != set(texts):
        return None  # no output, or a choice that never finished
    chat = first.get("object") == "chat.completion.chunk"
    choices = []
    for index in sorted(texts):
        text = "".join(texts[index])
        if chat:
            choices.append({"index": index, "message": {"role": "assistant", "content": text},
                            "logprobs": None, "finish_reason": finish[index]})
        else:
            choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": finish[index]})
    body = {"id": first.get("id"), "object": "chat.completion" if chat else "text_completion",
            "created": first.get("created", 0), "model": first.get("model"), "choices": choices}
    if usage:
        body["usage"] = usage
    return msgspec.json.encode(body)
