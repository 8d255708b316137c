"""Error bodies and status codes for bad requests (CONFORMANCE.md §3). Each case ends by checking
that the engine still serves: a bad request must never take it down."""

from __future__ import annotations

import httpx
import pytest

from tests.conformance.conftest import Engine, prompt_ids


def still_serving(client: httpx.Client) -> None:
    r = client.post("/generate", json={"input_ids": prompt_ids(5), "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200, r.text


def assert_openai_error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["object"] == "error" and body["code"] == status and body["message"]
    return body


def test_native_prompt_longer_than_the_context_is_400(engine: Engine, client: httpx.Client):
    r = client.post("/generate", json={"input_ids": prompt_ids(engine.context_length + 8),
                                       "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400, r.text
    assert "context length" in r.json()["error"]["message"]
    still_serving(client)


def test_openai_prompt_plus_max_tokens_past_the_context_is_400(engine: Engine, client: httpx.Client):
    r = client.post("/v1/completions", json={"model": engine.model, "prompt": prompt_ids(32),
                                             "max_tokens": engine.context_length})
    body = assert_openai_error(r)
    assert "context length" in body["message"]
    still_serving(client)


def test_openai_non_list_stop_token_ids_is_a_validation_400(engine: Engine, client: httpx.Client):
    # SGLang's protocol models type stop_token_ids as Optional[List[int]]: pydantic rejects 5.
    r = client.post("/v1/chat/completions", json={"model": engine.model, "stop_token_ids": 5, "max_tokens": 2,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert_openai_error(r)
    still_serving(client)


def test_native_non_iterable_stop_token_ids_fails_without_taking_the_engine_down(client: httpx.Client):
    # /generate passes sampling_params through untyped; SGLang builds its SamplingParams from them and
    # a non-iterable stop_token_ids raises a TypeError, which /generate does not turn into a 400
    # (only ValueErrors are): read from the source, the answer is a 500. Either way: an error, no answer.
    r = client.post("/generate", json={"input_ids": prompt_ids(5), "sampling_params": {"max_new_tokens": 2,
                                                                                      "stop_token_ids": 5}})
    assert r.status_code in (400, 500), r.text
    still_serving(client)


@pytest.mark.parametrize("body", [{"priority": "high"}, {"stream": [1]}])
def test_native_top_level_field_of_the_wrong_type_is_a_validation_400(client: httpx.Client, body: dict):
    # FastAPI validates GenerateReqInput's own fields (lax: "5" is an int, "yes" a bool) before the handler.
    r = client.post("/generate", json={"input_ids": prompt_ids(5), "sampling_params": {"max_new_tokens": 1},
                                       **body})
    assert_openai_error(r)
    still_serving(client)


def test_openai_missing_messages_is_400(engine: Engine, client: httpx.Client):
    r = client.post("/v1/chat/completions", json={"model": engine.model, "max_tokens": 2})
    assert_openai_error(r)


def test_unknown_path_is_404(client: httpx.Client):
    assert client.get("/no/such/endpoint").status_code == 404
