"""``/v1/embeddings`` end to end: the real ``openai`` SDK through the edge to a simulator started
with ``--is-embedding`` (as SGLang is for an embedding model), beside a generation model."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from dataplane.sim.process import SimProcess
from tests.edge.conftest import SIM_ARGS, make_key, module_edge, sdk_client, standalone_config

KEY = make_key("embed")
HIDDEN = 896  # qwen2.5-0.5b's hidden size, the simulator's embedding dimension for it


@pytest.fixture(scope="module")
def edge(sims, tmp_path_factory):
    with SimProcess(served_model_name="embedder-bf16", model_path="Qwen/Qwen2.5-0.5B-Instruct", ready_delay=0.0,
                    extra_args=[*SIM_ARGS, "--is-embedding"]) as embedder:
        embedder.wait_healthy()
        cfg = standalone_config([sims[0].url], [{"name": "a", "keys": [{"dev_key": KEY}]}], model="chat")
        embed = standalone_config([embedder.url], [], model="embedder", served="embedder-bf16",
                                  context_length=512)["models"][0]
        embed["tiers"][0]["task"] = "embed"
        cfg["models"].append(embed)
        with module_edge(cfg, tmp_path_factory, "edge-embed") as proc:
            yield proc


def client(edge) -> openai.OpenAI:
    return sdk_client(edge, KEY)


def test_embeddings_are_unit_vectors_that_compare_like_their_texts(edge):
    c = client(edge)
    texts = ["the cat sat on the mat", "the cat sat on the mat", "a cat sat on a mat", "quarterly revenue grew"]
    out = c.embeddings.create(model="embedder", input=texts)  # the SDK asks for base64 and decodes it
    assert out.model == "embedder" and [d.index for d in out.data] == [0, 1, 2, 3]
    vecs = [np.array(d.embedding) for d in out.data]
    assert all(len(v) == HIDDEN and abs(np.linalg.norm(v) - 1) < 1e-5 for v in vecs)
    assert vecs[0] @ vecs[1] > 0.9999  # equal texts, equal vectors
    assert vecs[0] @ vecs[2] > vecs[0] @ vecs[3] + 0.3  # shared words point the same way
    assert out.usage.prompt_tokens > 10 and out.usage.total_tokens == out.usage.prompt_tokens
    floats = c.embeddings.create(model="embedder", input="the cat sat on the mat", encoding_format="float",
                                 dimensions=64)
    assert len(floats.data[0].embedding) == 64
    assert abs(np.linalg.norm(floats.data[0].embedding) - 1) < 1e-5
    assert c.embeddings.create(model="embedder", input=[1, 2, 3]).usage.prompt_tokens == 3  # token ids


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "embedder"}, 400, "input"),
    ({"model": "embedder", "input": ""}, 400, "input"),
    ({"model": "embedder", "input": ["ok", 5]}, 400, "input[1]"),
    ({"model": "embedder", "input": ["x"] * 2049}, 400, "input"),
    ({"model": "embedder", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"model": "embedder", "input": "x", "dimensions": 0}, 400, "dimensions"),
    ({"model": "embedder", "input": "x", "stream": True}, 400, "stream"),  # not an embeddings field
    ({"model": "embedder", "input": "word " * 2000}, 400, "input"),  # past the 512-token context
    ({"model": "chat", "input": "x"}, 400, "model"),  # a generation model serves no embeddings
    ({"model": "nope", "input": "x"}, 404, "model"),
])
def test_bad_embedding_requests_are_4xx_naming_the_param(edge, body, status, param):
    r = httpx.post(edge.url + "/v1/embeddings", json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_an_embedding_model_does_not_generate(edge):
    with pytest.raises(openai.BadRequestError) as exc:
        client(edge).chat.completions.create(model="embedder", messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["code"] == "model_not_supported" and exc.value.body["param"] == "model"
