"""``sse.assemble``: a streamed answer added up into the whole answer, so a streamed miss fills the
response caches, and ``sse.replay`` of it streams the same text again. Streams a replay would not
reproduce exactly are not cached."""

from __future__ import annotations

import msgspec

from dataplane.edge.sse import assemble, replay


def stream(*events: dict) -> bytes:
    return b"".join(b"data: " + msgspec.json.encode(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chunk(delta: dict | None = None, finish=None, index=0, text=None, **extra) -> dict:
    choice = {"index": index, "finish_reason": finish, **extra}
    if text is not None:
        return {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
                "choices": [{**choice, "text": text}]}
    return {"id": "c-1", "object": "chat.completion.chunk", "created": 5, "model": "m",
            "choices": [{**choice, "delta": delta or {}}]}


USAGE = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_a_chat_stream_adds_up_and_replays_to_the_same_text():
    s = stream(chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}), chunk({"content": "lo"}),
               chunk({}, finish="stop"))
    whole = msgspec.json.decode(assemble(s, USAGE))
    assert whole["object"] == "chat.completion" and whole["id"] == "c-1" and whole["usage"] == USAGE
    assert whole["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                 "logprobs": None, "finish_reason": "stop"}]
    again = b"".join(e for e in replay(msgspec.json.encode(whole), True, False).split(b"\n\n") if e)
    assert b'"content":"Hello"' in again and b'"finish_reason":"stop"' in again


def test_a_completions_stream_adds_up():
    s = stream(chunk(text="a"), chunk(text="b", finish="length"))
    whole = msgspec.json.decode(assemble(s, None))
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == "ab"
    assert "usage" not in whole


def test_streams_a_replay_would_not_reproduce_are_not_cached():
    tool = chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}, finish="tool_calls")
    assert assemble(stream(tool), USAGE) is None
    assert assemble(stream(chunk({"content": "x"}, logprobs={"content": []}), chunk({}, finish="stop")), USAGE) is None
    assert assemble(stream(chunk({"content": "x"})), USAGE) is None  # never finished
    assert assemble(b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n', USAGE) is None
    assert assemble(b"data: [DONE]\n\n", USAGE) is None
