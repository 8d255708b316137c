"""The Batch API's input validation and output lines (pure functions)."""

from __future__ import annotations

import json

import pytest

from controlplane.batches import jsonl

CHAT = "/v1/chat/completions"


def line(custom_id: str = "a", **over) -> str:
    item = {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
    item.update(over)
    return json.dumps(item)


def parse(*raw: str, max_requests: int = 100):
    return jsonl.parse_input("\n".join(raw).encode(), CHAT, max_requests)


def test_a_good_file_gives_its_lines_in_order_numbered_from_one() -> None:
    lines, problems = parse(line("a"), "", line("b"))
    assert problems == []
    assert [(ln.line, ln.custom_id) for ln in lines] == [(1, "a"), (3, "b")]
    assert lines[0].body["model"] == "m"


@pytest.mark.parametrize(("raw", "code", "param"), [
    ("{not json", "invalid_json_line", None),
    ("[1, 2]", "invalid_json_line", None),
    (line(custom_id=""), "missing_required_parameter", "custom_id"),
    (line(custom_id=7), "missing_required_parameter", "custom_id"),
    (line("x" * 513), "invalid_value", "custom_id"),
    (line(method="GET"), "invalid_method", "method"),
    (line(url="/v1/embeddings"), "mismatched_endpoint", "url"),
    (line(body="text"), "invalid_request", "body"),
    (line(body={"messages": []}), "missing_required_parameter", "body.model"),
    (line(extra=1), "invalid_request", None),
])
def test_one_bad_line_fails_the_file_naming_the_line_and_param(raw: str, code: str, param: str | None) -> None:
    lines, problems = parse(line("ok"), raw)
    assert lines == []
    assert (problems[0].code, problems[0].line, problems[0].param) == (code, 2, param)


def test_a_repeated_custom_id_is_refused() -> None:
    _, problems = parse(line("a"), line("a"))
    assert [(p.code, p.line) for p in problems] == [("duplicate_custom_id", 2)]


def test_empty_non_utf8_and_oversized_files() -> None:
    assert parse("", " ")[1][0].code == "empty_file"
    assert jsonl.parse_input(b"\xff\xfe", CHAT, 10)[1][0].code == "invalid_file_format"
    _, problems = parse(*(line(str(i)) for i in range(4)), max_requests=3)
    assert problems[0].code == "too_many_requests" and "at most 3" in problems[0].message


def test_errors_are_capped_so_a_huge_bad_file_cannot_make_a_huge_error_object() -> None:
    _, problems = parse(*["{"] * 500)
    assert len(problems) == jsonl.MAX_REPORTED_ERRORS


def test_output_lines_have_openai_shape_and_stable_ids() -> None:
    item = jsonl.InputLine(4, "c-4", {"model": "m"})
    ok = json.loads(jsonl.answered("batch_x", item, 200, {"id": "chatcmpl"}))
    assert ok["custom_id"] == "c-4" and ok["error"] is None
    assert ok["response"] == {"status_code": 200, "request_id": "batch_x:4", "body": {"id": "chatcmpl"}}
    failed = json.loads(jsonl.unanswered("batch_x", item, "batch_expired", "too late"))
    assert failed["response"] is None and failed["error"] == {"code": "batch_expired", "message": "too late"}
    assert ok["id"] == failed["id"] == jsonl.record_id("batch_x", 4) != jsonl.record_id("batch_x", 5)
