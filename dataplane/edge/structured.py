"""Validation of the structured fields of a chat request: ``tools``, ``tool_choice`` and
``response_format``. OpenAI answers a malformed one with a 400 naming the exact ``param``; an
engine would either 500 or silently ignore it, so the edge checks the shape here.

The shapes are OpenAI's (function tools; ``json_object`` / ``json_schema`` formats) plus SGLang's
``structural_tag`` format. Schemas themselves are the engine's to compile: only their type is
checked, since a JSON Schema the grammar backend cannot compile is the engine's 400 to give.

``tools_text`` is what the tool definitions add to the prompt: chat templates render them into it,
so they count in the token estimate (limits, routing) and in the prefix the router hashes."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from dataplane.edge import errors

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CHOICE_MODES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema", "structural_tag")


def _fail(message: str, param: str) -> errors.EdgeError:
    return errors.bad_request(message, param=param)


def _function_name(value: Any, param: str) -> str:
    if not isinstance(value, str) or not FUNCTION_NAME.fullmatch(value):
        raise _fail(f"`{param}` must be 1 to 64 letters, digits, underscores or dashes.", param)
    return value


def check_tools(tools: Any) -> list[str]:
    """The declared function names, in order; a 400 for any malformed tool."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _fail("`tools` must be an array of tool objects.", "tools")
    names: list[str] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _fail(f"`{where}` must be an object.", where)
        if tool.get("type", "function") != "function":
            raise _fail(f"`{where}.type` must be 'function'.", f"{where}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise _fail(f"`{where}.function` must be an object.", f"{where}.function")
        name = _function_name(fn.get("name"), f"{where}.function.name")
        if name in names:
            raise _fail(f"Tool names must be unique; '{name}' appears twice.", f"{where}.function.name")
        names.append(name)
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise _fail(f"`{where}.function.description` must be a string.", f"{where}.function.description")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _fail(f"`{where}.function.parameters` must be a JSON Schema object.", f"{where}.function.parameters")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise _fail(f"`{where}.function.strict` must be a boolean.", f"{where}.function.strict")
    return names


def check_tool_choice(choice: Any, names: list[str]) -> None:
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in TOOL_CHOICE_MODES:
            raise _fail(f"`tool_choice` must be one of {list(TOOL_CHOICE_MODES)} or a function object.", "tool_choice")
        if choice == "required" and not names:
            raise _fail("`tool_choice` 'required' needs `tools`.", "tool_choice")
        return
    if not isinstance(choice, dict) or choice.get("type", "function") != "function" \
            or not isinstance(choice.get("function"), dict):
        raise _fail("`tool_choice` must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}.",
                    "tool_choice")
    name = _function_name(choice["function"].get("name"), "tool_choice.function.name")
    if name not in names:
        raise _fail(f"`tool_choice` names the function '{name}', which is not in `tools`.",
                    "tool_choice.function.name")


def check_response_format(fmt: Any) -> None:
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") not in RESPONSE_FORMATS:
        raise _fail(f"`response_format.type` must be one of {list(RESPONSE_FORMATS)}.", "response_format.type")
    if fmt["type"] != "json_schema":
        return
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise _fail("`response_format.json_schema` is required for type 'json_schema' and must be an object.",
                    "response_format.json_schema")
    _function_name(spec.get("name"), "response_format.json_schema.name")
    if spec.get("schema") is not None and not isinstance(spec["schema"], dict):
        raise _fail("`response_format.json_schema.schema` must be a JSON Schema object.",
                    "response_format.json_schema.schema")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise _fail("`response_format.json_schema.strict` must be a boolean.", "response_format.json_schema.strict")


def check_logprobs(body: dict[str, Any], chat: bool) -> None:
    """Chat: ``logprobs`` a boolean, ``top_logprobs`` 0-20 and only with ``logprobs``; completions:
    ``logprobs`` an integer 0-5 (OpenAI's bounds)."""
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if chat:
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _fail("`logprobs` must be a boolean.", "logprobs")
        if top is not None:
            if type(top) is not int or not 0 <= top <= 20:
                raise _fail("`top_logprobs` must be an integer between 0 and 20.", "top_logprobs")
            if not logprobs:
                raise _fail("`logprobs` must be true when `top_logprobs` is set.", "top_logprobs")
    elif logprobs is not None and (type(logprobs) is not int or not 0 <= logprobs <= 5):
        raise _fail("`logprobs` must be an integer between 0 and 5.", "logprobs")


def tools_text(tools: Any) -> str:
    return "" if not tools else "<|tools|>" + msgspec.json.encode(tools).decode()
