"""OpenAI API parity at the edge (issue 17, first part), with the real ``openai`` SDK through a real
edge to real simulators: the requested model name echoed in every answer, ``models.retrieve``, and
unknown request fields refused the way OpenAI refuses them."""

from __future__ import annotations

import httpx
import openai
import pytest

from dataplane.edge import errors
from dataplane.edge.echo import echo, model_rewrite
from dataplane.edge.settings import EdgeSettings
from dataplane.edge.validation import CHAT, COMPLETION, TokenEstimator, validate
from tests.edge.conftest import add_tier, make_key, module_edge, sdk_client, standalone_config

KEY = make_key("parity")
MSGS = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def edge(sims, tmp_path_factory):
    # The engines serve "demo"; tenants ask for "llama-3.1-8b" (default tier bf16) or "llama-3.1-8b:fp8".
    cfg = standalone_config([sims[0].url], [{"name": "a", "keys": [{"dev_key": KEY}]}], model="llama-3.1-8b",
                            settings={"extra_request_fields": ["lora_path"]})
    with module_edge(add_tier(cfg, "fp8", sims[1].url), tmp_path_factory, "edge-parity") as proc:
        yield proc


def client(edge) -> openai.OpenAI:
    return sdk_client(edge, KEY)


@pytest.mark.parametrize("asked", ["llama-3.1-8b", "llama-3.1-8b:fp8", "llama-3.1-8b:bf16"])
def test_every_answer_names_the_model_the_client_asked_for(edge, asked):
    c = client(edge)
    chat = c.chat.completions.create(model=asked, messages=MSGS, max_tokens=3)
    assert chat.model == asked
    assert c.completions.create(model=asked, prompt="hi", max_tokens=2).model == asked
    chunks = list(c.chat.completions.create(model=asked, messages=MSGS, max_tokens=3, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks and {ch.model for ch in chunks} == {asked}  # the usage chunk included
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    raw = httpx.post(edge.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                     json={"model": asked, "messages": MSGS, "max_tokens": 2, "stream": True}).text
    assert '"model":"demo"' not in raw and f'"model":"{asked}"' in raw


def test_models_retrieve_answers_a_visible_model_and_404s_the_rest(edge):
    c = client(edge)
    assert {m.id for m in c.models.list()} == {"llama-3.1-8b", "llama-3.1-8b:fp8"}
    card = c.models.retrieve("llama-3.1-8b:fp8")
    assert card.id == "llama-3.1-8b:fp8" and card.object == "model"
    assert c.models.retrieve("llama-3.1-8b:bf16").id == "llama-3.1-8b"  # the default tier is the bare name
    for missing in ("nope", "llama-3.1-8b:int4", "demo"):  # "demo" is only the engines' name
        with pytest.raises(openai.NotFoundError) as exc:
            c.models.retrieve(missing)
        assert exc.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=edge.url + "/v1", api_key="nmb_nobody00_x", max_retries=0).models.retrieve("llama-3.1-8b")


@pytest.mark.parametrize("field", ["made_up", "rid", "bootstrap_host", "custom_logit_processor", "input_ids"])
def test_an_unknown_or_internal_field_is_a_400_naming_it(edge, field):
    with pytest.raises(openai.BadRequestError) as exc:
        client(edge).chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=2,
                                             extra_body={field: "x"})
    body = exc.value.body
    assert body["param"] == field and body["code"] == "unrecognized_argument"
    assert body["message"] == f"Unrecognized request argument supplied: {field}"


def test_documented_extras_and_operator_allowed_fields_pass(edge):
    c = client(edge)
    extras = {"top_k": 5, "min_p": 0.1, "ignore_eos": True, "repetition_penalty": 1.1, "min_tokens": 1}
    out = c.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=3, extra_body=extras,
                                    metadata={"team": "x"}, user="u1", seed=7)
    assert out.usage.completion_tokens == 3
    # lora_path is internal by default; this edge's operator allowed it (extra_request_fields)
    assert c.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=1,
                                extra_body={"lora_path": None}).choices


def test_field_sets_differ_by_endpoint_and_settings_parse_from_the_environment():
    est = TokenEstimator()
    validate(CHAT, {"model": "m", "messages": MSGS, "tools": []}, est)
    with pytest.raises(errors.EdgeError) as exc:  # tools belong to chat, not to completions
        validate(COMPLETION, {"model": "m", "prompt": "x", "tools": []}, est)
    assert exc.value.status == 400 and exc.value.param == "tools"
    validate(COMPLETION, {"model": "m", "prompt": "x", "suffix": "!", "echo": False}, est)
    with pytest.raises(errors.EdgeError):
        validate(CHAT, {"model": "m", "messages": MSGS, "suffix": "!"}, est)
    settings = EdgeSettings().with_env({"NIMBUS_EDGE_EXTRA_REQUEST_FIELDS": "lora_path, session_params"})
    assert settings.extra_request_fields == ("lora_path", "session_params")
    validate(CHAT, {"model": "m", "messages": MSGS, "lora_path": "a"}, est,
             extra_fields=frozenset(settings.extra_request_fields))


def test_the_echo_rewrites_only_the_model_field():
    rewrite = model_rewrite("llama-fp8", 'llama-3.1-8b:fp8')
    assert model_rewrite("same", "same") is None
    body = b'{"id":"x","model":"llama-fp8","choices":[{"text":"\\"model\\":\\"llama-fp8\\" said"}]}'
    assert echo(body, rewrite) == body.replace(b'"model":"llama-fp8"', b'"model":"llama-3.1-8b:fp8"', 1)
    assert echo(body, None) is body


FN = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
# One bad value per field of the chat request (several for the structured ones); each must be a 400
# naming the param.
BAD_CHAT = [
    ({"model": 5}, "model"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "x", "name": 3}]}, "messages[0].name"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": "9"}, "max_completion_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": -0.1}, "top_p"),
    ({"n": 0}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
    ({"stop": 123}, "stop"),
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"seed": "abc"}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"user": 7}, "user"),
    ({"logprobs": 1}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"1": "x"}}, "logit_bias"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [FN, FN]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools[0].function.parameters"),
    ({"tool_choice": "always", "tools": [FN]}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "other"}}, "tools": [FN]}, "tool_choice.function.name"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}, "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": []}}},
     "response_format.json_schema.schema"),
    ({"top_k": 0}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 3}, "repetition_penalty"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"ignore_eos": "true"}, "ignore_eos"),
    ({"priority": "urgent"}, "priority"),
    ({"made_up": 1}, "made_up"),
]
BAD_COMPLETION = [
    ({"prompt": 5}, "prompt"),
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"suffix": 1}, "suffix"),
    ({"echo": "no"}, "echo"),
    ({"best_of": "2"}, "best_of"),
    ({"tools": [FN]}, "tools"),  # a chat field
]


@pytest.mark.parametrize(("kind", "patch", "param"), [("chat", p, q) for p, q in BAD_CHAT]
                         + [("completion", p, q) for p, q in BAD_COMPLETION])
def test_a_bad_value_of_any_field_is_a_400_naming_it(edge, kind, patch, param):
    base = ({"model": "llama-3.1-8b", "messages": MSGS, "max_tokens": 2} if kind == "chat"
            else {"model": "llama-3.1-8b", "prompt": "x", "max_tokens": 2})
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    r = httpx.post(edge.url + path, json={**base, **patch}, headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    assert r.status_code == 400, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_tools_count_in_the_prompt_estimate_and_valid_structured_requests_pass(edge):
    est = TokenEstimator(4.0)
    plain = validate(CHAT, {"model": "m", "messages": MSGS}, est)
    tools = [{**FN, "function": {**FN["function"], "description": "d" * 4000}}]
    with_tools = validate(CHAT, {"model": "m", "messages": MSGS, "tools": tools, "tool_choice": "auto"}, est)
    assert with_tools.prompt_tokens_est >= plain.prompt_tokens_est + 1000
    c = client(edge)
    out = c.chat.completions.create(
        model="llama-3.1-8b", messages=MSGS, max_tokens=2, tools=[FN],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}})
    assert out.choices


# ---- the simulator speaks tools, JSON schemas, logprobs and n, so the SDK can test them end to end ----

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "required": ["city", "unit", "days"], "properties": {
        "city": {"type": "string", "minLength": 2},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "hourly": {"type": "boolean"},
        "stations": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}}}}}
REPORT = {"type": "object", "required": ["title", "score", "tags", "author"], "properties": {
    "title": {"type": "string"}, "score": {"type": "number", "minimum": 0, "maximum": 1},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 2},
    "author": {"anyOf": [{"type": "object", "properties": {"name": {"type": "string"}}}, {"type": "null"}]}},
    "$defs": {"tag": {"type": "string", "enum": ["a", "b", "c"]}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_required_tool_call_comes_back_with_arguments_valid_against_its_schema(edge, choice):
    import json

    import jsonschema

    c = client(edge)
    out = c.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=400, tools=[WEATHER],
                                    tool_choice=choice)
    (call,) = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls" and out.choices[0].message.content is None
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert out.usage.completion_tokens > 5  # the arguments were generated token by token

    # Streamed: the first delta names the call, the rest carry its arguments, as SGLang streams them.
    chunks = list(c.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=400, tools=[WEATHER],
                                            tool_choice=choice, stream=True))
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or []) if ch.choices]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert all(d.id is None for d in deltas[1:]) and len(deltas) > 3
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


def test_tool_choice_auto_and_none_answer_in_text(edge):
    for choice in ("auto", "none"):
        out = client(edge).chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=4,
                                                   tools=[WEATHER], tool_choice=choice)
        assert out.choices[0].message.tool_calls is None and out.choices[0].message.content


def test_a_json_schema_response_is_valid_against_the_schema_streamed_or_not(edge):
    import json

    import jsonschema

    c = client(edge)
    fmt = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}}
    out = c.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=500, response_format=fmt)
    jsonschema.validate(json.loads(out.choices[0].message.content), REPORT)
    assert out.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="llama-3.1-8b", messages=MSGS, max_tokens=500, response_format=fmt, stream=True) if ch.choices)
    assert streamed == out.choices[0].message.content  # same request, same answer
    obj = c.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=100,
                                    response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    cut = c.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=3, response_format=fmt)
    assert cut.choices[0].finish_reason == "length"  # a schema cut by max_tokens is not valid JSON, as on SGLang


def test_logprobs_and_top_logprobs(edge):
    c = client(edge)
    out = c.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=5, logprobs=True,
                                    top_logprobs=3, extra_body={"ignore_eos": True})
    content = out.choices[0].logprobs.content
    assert len(content) == 5 and "".join(t.token for t in content) == out.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    streamed = [lp for ch in c.chat.completions.create(
        model="llama-3.1-8b", messages=MSGS, max_tokens=5, logprobs=True, top_logprobs=3, stream=True,
        extra_body={"ignore_eos": True}) if ch.choices and ch.choices[0].logprobs for lp in ch.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    comp = c.completions.create(model="llama-3.1-8b", prompt="hi", max_tokens=4, logprobs=2,
                                extra_body={"ignore_eos": True})
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == 4 and "".join(lp.tokens) == comp.choices[0].text and len(lp.top_logprobs[0]) == 2
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])


def test_n_choices_differ_and_are_counted_in_usage(edge):
    c = client(edge)
    out = c.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=6, n=2,
                                    extra_body={"ignore_eos": True})
    assert [ch.index for ch in out.choices] == [0, 1]
    assert out.choices[0].message.content != out.choices[1].message.content
    assert out.usage.completion_tokens == 12
    chunks = list(c.chat.completions.create(model="llama-3.1-8b", messages=MSGS, max_tokens=6, n=2, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    texts = {i: "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices and ch.choices[0].index == i)
             for i in (0, 1)}
    assert texts == {0: out.choices[0].message.content, 1: out.choices[1].message.content}
    assert chunks[-1].usage.completion_tokens == 12
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length", "length"]


# ---- interactive traffic first: a share of the slots, and SGLang's own priority --------------------


def test_the_engine_hears_the_request_class_only_where_it_schedules_by_priority():
    import msgspec

    from dataplane.edge.validation import upstream_body

    req = validate(CHAT, {"model": "m", "messages": MSGS, "priority": "batch"}, TokenEstimator())
    assert "priority" not in msgspec.json.decode(upstream_body(req, "s", "batch", None))
    assert msgspec.json.decode(upstream_body(req, "s", "batch", "high_first"))["priority"] == 0
    assert msgspec.json.decode(upstream_body(req, "s", "interactive", "high_first"))["priority"] == 100
    assert msgspec.json.decode(upstream_body(req, "s", "batch", "low_first"))["priority"] == 100
    assert msgspec.json.decode(upstream_body(req, "s", "interactive", "low_first"))["priority"] == 0


def test_batch_work_leaves_a_share_of_the_slots_to_interactive_traffic():
    from dataplane.edge.policies import RouteRequest
    from tests.edge.test_routing import catalog, make_router

    cat = catalog(n=1, max_running=10)
    router = make_router("round_robin")
    probe = RouteRequest([], 1, 1)

    def candidates():
        return router.eligible(cat, list(cat.replicas.values()), 0.0)

    def offered(keep_free: float) -> bool:  # a second later: no batch prompt is still being prefilled
        return router.choose(probe, candidates(), 1.0, keep_free=keep_free) is not None

    def send(batch: bool):
        return router.dispatch(cat, router.choose(probe, candidates(), 0.0), probe, 10, 0.0, batch=batch)

    for _ in range(7):
        send(batch=True)
    assert offered(0.2)  # 7 of 10 in flight: batch may take the eighth slot
    send(batch=True)
    assert not offered(0.2) and offered(0.0)  # 8 of 10: the last two are interactive's
    send(batch=False)
    send(batch=False)
    assert not offered(0.0)  # full


def test_batch_work_does_not_start_where_an_interactive_request_waits_for_its_first_token():
    from dataplane.edge.policies import RouteRequest
    from tests.edge.test_routing import catalog, make_router

    cat = catalog(n=1, max_running=10)
    router = make_router("round_robin")
    probe = RouteRequest([], 1, 1)

    def candidates():
        return router.eligible(cat, list(cat.replicas.values()), 0.0)

    for _ in range(3):
        router.dispatch(cat, router.choose(probe, candidates(), 0.0), probe, 10, 0.0, batch=True)
    interactive = router.dispatch(cat, router.choose(probe, candidates(), 0.0), probe, 10, 0.0)
    assert router.choose(probe, candidates(), 0.0, keep_free=0.2) is None  # it would share the prefill
    router.first_byte(interactive, 0.005)
    assert router.choose(probe, candidates(), 1.0, keep_free=0.2) is not None
    assert router.load(next(iter(cat.replicas))).interactive_prefilling == 0


def test_an_unwatched_prefill_is_presumed_over_at_its_predicted_ttft_without_teaching_the_model():
    """A non-streamed request's first byte is its last: the edge books its prefill as over at the
    TTFT it predicted (the service arms a timer), so it neither holds batch work off its replica nor
    stays in the replica's backlog while it generates; a guess teaches the TTFT model nothing."""
    from dataplane.edge.policies import RouteRequest
    from tests.edge.test_routing import catalog, make_router

    cat = catalog(n=1, max_running=10)
    router = make_router("round_robin")
    prompt = RouteRequest([], 1000, 4000)
    candidates = router.eligible(cat, list(cat.replicas.values()), 0.0)
    ticket = router.dispatch(cat, router.choose(prompt, candidates, 0.0), prompt, 10, 0.0)
    load = router.load(ticket.replica.id)
    per_token = router.ttft_model.prefill_ms_per_token
    assert router.presumed_ttft_s(ticket) == pytest.approx((ticket.rtt_ms + 1000 * per_token) / 1000)
    assert (load.pending_prefill_tokens, load.interactive_prefilling) == (1000, 1)
    assert router.choose(prompt, candidates, 1.0, keep_free=0.2) is None
    assert router.prefill_over(ticket)
    assert (load.pending_prefill_tokens, load.interactive_prefilling) == (0, 0)
    assert router.choose(prompt, candidates, 1.0, keep_free=0.2) is not None
    assert not router.prefill_over(ticket)  # once
    router.release(ticket, True, 5.0)
    assert (load.pending_prefill_tokens, load.interactive_prefilling, load.inflight) == (0, 0, 0)
    assert router.ttft_model.prefill_ms_per_token == per_token


def test_batch_work_is_paced_by_the_predicted_prefill_time_of_the_batch_prompts_sent():
    """A wave of batch prompts is one long prefill step that an interactive arrival must wait out,
    so batch work is paced: a batch request starts on a replica only while the batch prompts
    already sent there have at most ``batch_prefill_backlog_ms`` of predicted prefill left (their
    uncached tokens at the TTFT model's per-token cost, one after another)."""
    from dataplane.edge.policies import RouteRequest
    from tests.edge.test_routing import catalog, make_router

    cat = catalog(n=2, max_running=10)
    prompt = RouteRequest([], 1000, 4000)  # 1000 uncached tokens: 100 ms of prefill predicted

    def batch(router, now: float):
        candidates = router.eligible(cat, list(cat.replicas.values()), 0.0)
        decision = router.choose(prompt, candidates, now, keep_free=0.2)
        return None if decision is None else router.dispatch(cat, decision, prompt, 10, now, batch=True)

    strict = make_router("round_robin", prefill_ms_per_token=0.1, batch_prefill_backlog_ms=0)
    first, second = batch(strict, 0.0), batch(strict, 0.01)
    assert {first.replica.id, second.replica.id} == {"rep0", "rep1"}  # each replica takes one
    assert batch(strict, 0.05) is None  # both are still prefilling a batch prompt
    everyone = strict.eligible(cat, list(cat.replicas.values()), 0.0)
    assert strict.choose(prompt, everyone, 0.05) is not None  # interactive work is never paced
    assert abs(strict.batch_paced_until(everyone, 0.05) - 0.1) < 1e-9  # the admission queue's next pump
    third = batch(strict, 0.1)
    assert third is not None and third.replica.id == first.replica.id
    assert strict.batch_paced_until(everyone, 0.2) is None

    # A backlog allowance of 150 ms lets a second prompt queue behind the first, not a third.
    loose = make_router("round_robin", prefill_ms_per_token=0.1, batch_prefill_backlog_ms=150)
    sent = [batch(loose, 0.0) for _ in range(6)]
    assert [t is not None for t in sent] == [True] * 4 + [False] * 2  # 2 per replica: 0-100, 100-200 ms
    assert abs(loose.load("rep0").batch_prefill_until - 0.2) < 1e-9

    unpaced = make_router("round_robin", prefill_ms_per_token=0.1, batch_prefill_backlog_ms=-1)
    assert all(batch(unpaced, 0.0) is not None for _ in range(6))
    assert unpaced.batch_paced_until(everyone, 0.0) is None


def test_a_timed_pump_dispatches_a_waiter_that_only_time_holds_back():
    import asyncio
    import time as _time

    from dataplane.edge.admission import Admission
    from dataplane.edge.fairness import Waiter

    async def scenario() -> tuple[str, float]:
        adm = Admission(queue_max=10, timeout_s=5.0, clock=_time.monotonic)
        opens = _time.monotonic() + 0.1
        started = _time.monotonic()

        def try_dispatch(now: float):
            if now < opens:
                adm.pump_at("v", opens - now)  # as the service does when pacing holds it back
                return None
            return "sent"

        got = await adm.admit("v", Waiter("t", 1.0, "batch", 10, started, try_dispatch))
        waited = _time.monotonic() - started
        await adm.stop()
        return got, waited

    # No ticker runs and nothing finishes: only the timer can have dispatched it, and promptly; on
    # the loop the edge runs on too (uvloop's timer handles have no ``when()``).
    import uvloop

    for run in (asyncio.run, uvloop.run):
        got, waited = run(scenario())
        assert got == "sent" and 0.09 <= waited < 1.0


def test_interactive_work_may_take_the_slots_batch_work_holds_where_the_engine_preempts_it():
    """SGLang preempts a running batch request for an interactive one when its batch is full, so the
    edge counts the slots its own batch requests hold as free for interactive work (and only there)."""
    from dataplane.edge.policies import RouteRequest
    from tests.edge.test_routing import catalog, make_router

    cat = catalog(n=1, max_running=4)
    router = make_router("round_robin")
    probe = RouteRequest([], 1, 1)

    def candidates():
        return router.eligible(cat, list(cat.replicas.values()), 0.0)

    tickets = []
    for _ in range(3):
        tickets.append(router.dispatch(cat, router.choose(probe, candidates(), 0.0), probe, 10, 0.0, batch=True))
    tickets.append(router.dispatch(cat, router.choose(probe, candidates(), 0.0), probe, 10, 0.0))
    assert router.choose(probe, candidates(), 0.0) is None  # full: 3 batch + 1 interactive
    assert router.choose(probe, candidates(), 0.0, preempts_batch=True) is not None
    assert router.choose(probe, candidates(), 0.0, keep_free=0.2) is None  # batch work never does
    for t in tickets[:3]:
        router.release(t, True, 0.0)
    load = router.load(next(iter(cat.replicas)))
    assert (load.inflight, load.batch_inflight) == (1, 0)


def test_batch_requests_yield_inside_an_engine_that_schedules_by_priority(edge_factory):
    import threading
    import time

    from dataplane.sim.process import SimProcess

    key = make_key("prio")
    # One running request at a time: everything else waits in the engine's own queue.
    with SimProcess(served_model_name="demo", ready_delay=0.0,
                    extra_args=["--time-scale", "1", "--max-running-requests", "1",
                                "--enable-priority-scheduling"]) as sim:
        sim.wait_healthy()
        cfg = standalone_config([sim.url], [{"name": "a", "keys": [{"dev_key": key}]}])
        cfg["models"][0]["tiers"][0]["priority_scheduling"] = "high_first"
        edge = edge_factory(cfg, redis_url="none")
        c = openai.OpenAI(base_url=edge.url + "/v1", api_key=key, max_retries=0, timeout=60)
        done: list[str] = []

        def ask(name: str, priority: str) -> None:
            c.completions.create(model="demo", prompt=name, max_tokens=25, extra_body={"priority": priority,
                                                                                        "ignore_eos": True})
            done.append(name)

        threads = [threading.Thread(target=ask, args=(f"batch{i}", "batch")) for i in range(6)]
        for t in threads:
            t.start()
            time.sleep(0.02)
        time.sleep(0.1)
        urgent = threading.Thread(target=ask, args=("interactive", "interactive"))
        urgent.start()
        for t in [*threads, urgent]:
            t.join(60)
        assert len(done) == 7
        # FIFO would finish it last; by priority it runs as soon as the running batch request ends.
        assert done.index("interactive") <= 2, done


def test_batch_work_leaves_the_recent_interactive_peak_plus_one_up_to_the_share():
    from dataplane.edge.fairness import RollingPeak
    from dataplane.edge.router import reserved_slots

    assert reserved_slots(100, 0.2, None) == 20  # no interactive history asked for: the whole share
    assert reserved_slots(100, 0.2, 0.0) == 1  # nothing interactive lately: one slot for the next one
    assert reserved_slots(100, 0.2, 6.2) == 8  # six-odd at once lately: seven plus one
    assert reserved_slots(100, 0.2, 60) == 20  # never more than the share
    peak = RollingPeak(60.0, 0.0)
    peak.observe(5, 1.0)
    assert peak.recent(30.0) == 5 and peak.recent(70.0) == 5  # still within the last one to two windows
    assert peak.recent(121.0) == 0.0  # quiet for two windows: it fades
