"""Batch input and output lines, in OpenAI's format. Pure functions: bytes in, lines or records out.

An input line is ``{"custom_id": …, "method": "POST", "url": <the batch's endpoint>, "body": {…}}``.
An output line is ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``;
a line that got no HTTP answer has ``response: null`` and an ``error`` instead.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MAX_CUSTOM_ID = 512
MAX_REPORTED_ERRORS = 100  # a file with a million bad lines gets the first hundred, like a compiler


@dataclass(frozen=True, slots=True)
class InputLine:
    line: int  # 1-based, as the errors name it
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LineError:
    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


def parse_input(data: bytes, endpoint: str, max_requests: int) -> tuple[list[InputLine], list[LineError]]:
    """Every line of a batch's input file, or what is wrong with it. One bad line fails the whole
    batch (OpenAI's rule: a batch is validated before any line runs, so nothing is half-done)."""
    lines: list[InputLine] = []
    problems: list[LineError] = []
    seen: set[str] = set()

    def bad(code: str, message: str, number: int | None, param: str | None = None) -> None:
        if len(problems) < MAX_REPORTED_ERRORS:
            problems.append(LineError(code, message, number, param))

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return [], [LineError("invalid_file_format", "The input file is not UTF-8 text.")]
    number = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError as exc:
            bad("invalid_json_line", f"Line {number} is not valid JSON: {exc}.", number)
            continue
        if not isinstance(item, dict):
            bad("invalid_json_line", f"Line {number} is not a JSON object.", number)
            continue
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            bad("missing_required_parameter", f"Line {number} has no custom_id (a non-empty string).", number,
                "custom_id")
            continue
        if len(custom_id) > MAX_CUSTOM_ID:
            bad("invalid_value", f"Line {number}: custom_id is longer than {MAX_CUSTOM_ID} characters.", number,
                "custom_id")
            continue
        if custom_id in seen:
            bad("duplicate_custom_id", f"Line {number}: custom_id '{custom_id[:64]}' is used more than once; "
                                       "every line needs its own.", number, "custom_id")
            continue
        seen.add(custom_id)
        if item.get("method") != "POST":
            bad("invalid_method", f"Line {number}: method must be 'POST'.", number, "method")
            continue
        if item.get("url") != endpoint:
            bad("mismatched_endpoint", f"Line {number}: url {item.get('url')!r} is not this batch's endpoint "
                                       f"{endpoint!r}.", number, "url")
            continue
        body = item.get("body")
        if not isinstance(body, dict):
            bad("invalid_request", f"Line {number}: body must be a JSON object.", number, "body")
            continue
        if not isinstance(body.get("model"), str) or not body["model"]:
            bad("missing_required_parameter", f"Line {number}: body.model is required.", number, "body.model")
            continue
        unknown = set(item) - {"custom_id", "method", "url", "body"}
        if unknown:
            bad("invalid_request", f"Line {number}: unrecognized field(s) {', '.join(sorted(unknown))}.", number)
            continue
        lines.append(InputLine(number, custom_id, body))
    if not problems and not lines:
        problems.append(LineError("empty_file", "The input file has no requests."))
    if len(seen) > max_requests:
        problems.insert(0, LineError("too_many_requests", f"The input file has {len(seen)} requests; a batch "
                                                           f"may have at most {max_requests}."))
    return (lines if not problems else []), problems


def request_id(batch_id: str, line: int) -> str:
    """The edge's request id for a line: the same on every attempt, so usage counts a line once
    however often a worker that died mid-line makes its successor send it again."""
    return f"{batch_id}:{line}"


def record_id(batch_id: str, line: int) -> str:
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{line}".encode()).hexdigest()[:24]


def answered(batch_id: str, item: InputLine, status_code: int, body: Any) -> str:
    """The output-file line of a request the edge answered (2xx: output file; else: error file)."""
    return json.dumps({
        "id": record_id(batch_id, item.line), "custom_id": item.custom_id,
        "response": {"status_code": status_code, "request_id": request_id(batch_id, item.line), "body": body},
        "error": None,
    }, separators=(",", ":"))


def unanswered(batch_id: str, item: InputLine, code: str, message: str) -> str:
    """The error-file line of a request that got no HTTP answer (transport failure, expiry)."""
    return json.dumps({
        "id": record_id(batch_id, item.line), "custom_id": item.custom_id, "response": None,
        "error": {"code": code, "message": message},
    }, separators=(",", ":"))
