"""The real openai SDK against the simulator: chat, completions, streaming, usage, errors."""

import openai
import pytest

from tests.sim.conftest import FAST


@pytest.fixture(scope="module")
def client(shared_sim):
    with openai.OpenAI(base_url=shared_sim.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_lists_served_name(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["sim-model"]


def test_chat_completion(client):
    resp = client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "Say hi"}], max_tokens=12
    )
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert len(choice.message.content.split()) == 12
    assert choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 12
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 12
    # SGLang reports prompt_tokens_details only when some prompt tokens were cached (else null).
    details = resp.usage.prompt_tokens_details
    assert details is None or details.cached_tokens > 0


def test_chat_is_deterministic_for_same_prompt(client):
    kwargs = dict(model="sim-model", messages=[{"role": "user", "content": "repeat me"}], max_tokens=6)
    a = client.chat.completions.create(**kwargs).choices[0].message.content
    b = client.chat.completions.create(**kwargs).choices[0].message.content
    assert a == b


def test_chat_stream_with_include_usage(client):
    stream = client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "stream please"}], max_tokens=10, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 10
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == 10
    details = usage_chunk.usage.prompt_tokens_details
    assert details is None or details.cached_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_without_usage_has_no_usage_chunk(client):
    chunks = list(client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True))
    assert all(c.choices for c in chunks)


def test_completion_and_stream_agree(client):
    full = client.completions.create(model="sim-model", prompt="Once upon a time", max_tokens=8)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 8
    chunks = list(client.completions.create(model="sim-model", prompt="Once upon a time", max_tokens=8,
                                            stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == full.choices[0].text
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_stop_sequence_is_honoured(client):
    text = client.completions.create(model="sim-model", prompt="stop test", max_tokens=20).choices[0].text
    stop_word = text.split()[4]
    resp = client.completions.create(model="sim-model", prompt="stop test", max_tokens=20, stop=[stop_word])
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].text == text[: text.index(stop_word)]


def test_bad_request_maps_to_sdk_error_class(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="sim-model", messages=[], max_tokens=4)
    assert err.value.status_code == 400
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model="sim-model", prompt="x", max_tokens=10_000_000)


def test_api_key_required_when_configured(start_sim):
    sim = start_sim(*FAST, "--api-key", "s3cret")
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="s3cret", max_retries=0) as good:
        assert good.completions.create(model="sim-model", prompt="hi", max_tokens=2).usage.completion_tokens == 2


def test_refusal_is_a_server_error_for_the_sdk(shared_sim, client):
    import httpx

    httpx.post(shared_sim.url + "/_sim/faults", json={"refuse": True}).raise_for_status()
    try:
        with pytest.raises(openai.InternalServerError) as err:
            client.completions.create(model="sim-model", prompt="hi", max_tokens=2)
        assert err.value.status_code == 503
    finally:
        httpx.delete(shared_sim.url + "/_sim/faults").raise_for_status()


def test_usage_reports_cached_tokens_for_a_shared_system_prompt(client):
    system = {"role": "system", "content": "You answer questions about the Nimbus cloud precisely. " * 60}
    first = client.chat.completions.create(
        model="sim-model", messages=[system, {"role": "user", "content": "one"}], max_tokens=2)
    second = client.chat.completions.create(
        model="sim-model", messages=[system, {"role": "user", "content": "two"}], max_tokens=2)
    first_details = first.usage.prompt_tokens_details  # null when nothing was cached, as SGLang
    assert first_details is None or first_details.cached_tokens < 100
    assert second.usage.prompt_tokens_details.cached_tokens > 400
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
