"""Per-key model allowlists at the edge: a model outside a key's list does not exist for that key
(404 ``model_not_found``, absent from ``/v1/models``), on every endpoint, with the real SDK."""

from __future__ import annotations

import openai
import pytest

from tests.edge.conftest import add_tier, make_key, module_edge, sdk_client, standalone_config

KEYS = {  # key -> its allowlist (None: every model)
    "all": None,
    "llama": ["llama"],  # every tier of llama
    "llama-fp8": ["llama:fp8"],
    "qwen": ["qwen"],
    "mixed": ["llama:bf16", "qwen"],
}
SECRETS = {name: make_key(name) for name in KEYS}
REQUESTS = ["llama", "llama:bf16", "llama:fp8", "qwen"]  # llama's default tier is bf16
ALLOWED = {
    "all": set(REQUESTS),
    "llama": {"llama", "llama:bf16", "llama:fp8"},
    "llama-fp8": {"llama:fp8"},
    "qwen": {"qwen"},
    "mixed": {"llama", "llama:bf16", "qwen"},
}


@pytest.fixture(scope="module")
def edge(sims, tmp_path_factory):
    keys = [{"dev_key": SECRETS[n], "allowed_models": allowed} for n, allowed in KEYS.items()]
    cfg = add_tier(standalone_config([sims[0].url], [{"name": "a", "keys": keys}], model="llama"), "fp8", sims[1].url)
    cfg["models"].append(standalone_config([sims[1].url], [], model="qwen")["models"][0])
    with module_edge(cfg, tmp_path_factory, "edge-allow") as proc:
        yield proc


def client(edge, name: str) -> openai.OpenAI:
    return sdk_client(edge, SECRETS[name])


@pytest.mark.parametrize("key", list(KEYS))
def test_the_isolation_matrix(edge, key):
    c = client(edge, key)
    for model in REQUESTS:
        if model in ALLOWED[key]:
            assert c.completions.create(model=model, prompt="x", max_tokens=1).choices, (key, model)
            stream = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                               max_tokens=1, stream=True)
            assert any(ch.choices for ch in stream)
            assert c.models.retrieve(model).id in (model, model.split(":")[0])
            continue
        for call in (lambda m=model: c.completions.create(model=m, prompt="x", max_tokens=1),
                     lambda m=model: c.chat.completions.create(model=m, messages=[{"role": "user", "content": "x"}],
                                                               max_tokens=1, stream=True),
                     lambda m=model: c.models.retrieve(m)):
            with pytest.raises(openai.NotFoundError) as exc:
                call()
            assert exc.value.body["code"] == "model_not_found", (key, model)
    listed = {m.id for m in c.models.list()}
    assert listed == {m for m in ALLOWED[key] if m != "llama:bf16"}, (key, listed)  # bf16 is listed as "llama"
