"""Tokenizer stability: equal text prefixes give equal token prefixes, across processes."""

import subprocess
import sys

from dataplane.sim import tokenizer
from dataplane.sim.process import REPO_ROOT


def test_same_text_prefix_same_token_prefix():
    base = "You are a helpful assistant. Answer briefly."
    a = tokenizer.encode(base + " What is the capital of France?")
    b = tokenizer.encode(base + " Tell me a joke.")
    prefix = tokenizer.encode(base)
    assert a[: len(prefix)] == prefix == b[: len(prefix)]
    assert a != b


def test_encoding_is_stable_across_processes():
    text = "stable across runs, unlike Python's salted hash()"
    code = f"from dataplane.sim import tokenizer; print(tokenizer.encode({text!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=REPO_ROOT)
    assert out.stdout.strip() == str(tokenizer.encode(text))


def test_chat_template_shares_system_prompt_prefix():
    system = {"role": "system", "content": "You are Nimbus, a concise assistant. " * 20}
    a = tokenizer.encode(tokenizer.apply_chat_template([system, {"role": "user", "content": "hi"}]))
    b = tokenizer.encode(tokenizer.apply_chat_template([system, {"role": "user", "content": "bye"}]))
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert shared > 100


def test_output_text_is_deterministic_per_seed_and_decodes():
    prompt = tokenizer.encode("hello")
    one = tokenizer.OutputStream(1, prompt)
    two = tokenizer.OutputStream(1, prompt)
    other = tokenizer.OutputStream(2, prompt)
    ids_one = [one.next_token() for _ in range(20)]
    assert ids_one == [two.next_token() for _ in range(20)]
    assert ids_one != [other.next_token() for _ in range(20)]
    text = tokenizer.decode(ids_one)
    assert len(text.split()) == 20 and "<" not in text
