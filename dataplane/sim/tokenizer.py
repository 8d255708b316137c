"""A deterministic stand-in tokenizer and the pseudo-text the simulated model "generates".

Why it looks like this:

* Routers and the radix cache only care that the *same text prefix gives the same token
  prefix*. Splitting into whitespace-led words (``" hello"``, ``" world"``) and hashing each
  piece with a stable hash (CRC32, not Python's salted ``hash``) gives exactly that, across
  processes and runs, at about a microsecond per token.
* The chat template renders messages into text first, so requests sharing a system prompt
  share a token prefix, like a real chat template does.
* Output tokens come from a fixed vocabulary of pronounceable words, chosen by a seeded
  generator keyed on the prompt, so the same prompt and seed always produce the same text,
  and decoding output ids back to text is exact.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterable, Sequence

VOCAB_SIZE = 128_256  # Llama-3's, so ids look plausible to anything that checks the range
EOS_TOKEN_ID = 128_009  # <|eot_id|>
_OUTPUT_VOCAB_BASE = 1_000  # output words live at ids [base, base + len(words))
_PIECE = re.compile(r"\s*\S+|\s+")

_SYLLABLES = (
    "ka", "lo", "mi", "ra", "tu", "sen", "vo", "da", "ne", "pi", "sor", "el", "an", "ti", "mu",
    "bra", "qui", "zo", "fe", "gal", "or", "in", "ys", "ha", "ri", "con", "ve", "lu", "sa", "den",
)


def _build_output_words(count: int = 4096) -> list[str]:
    rng = random.Random(0x5EED)  # fixed: the vocabulary itself never changes between runs
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < count:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


OUTPUT_WORDS = _build_output_words()


def encode(text: str) -> list[int]:
    """Text -> token ids; a pure function of the text, stable across processes."""
    # Input ids stay clear of the output-word range so they never decode as generated words.
    span = VOCAB_SIZE - 2 * _OUTPUT_VOCAB_BASE - len(OUTPUT_WORDS)
    offset = _OUTPUT_VOCAB_BASE + len(OUTPUT_WORDS)
    return [offset + zlib.crc32(piece.encode()) % span for piece in _PIECE.findall(text)]


def piece_id(piece: str) -> int:
    """One id for a piece of constrained output (which need not be a whole word); stable, in the
    input range, so it never decodes as a generated word: the request's pieces carry its text."""
    span = VOCAB_SIZE - 2 * _OUTPUT_VOCAB_BASE - len(OUTPUT_WORDS)
    return _OUTPUT_VOCAB_BASE + len(OUTPUT_WORDS) + zlib.crc32(piece.encode()) % span


def decode(token_ids: Iterable[int]) -> str:
    """Output ids -> text. Ids outside the output vocabulary (prompt ids) render as ``<id>``."""
    return "".join(token_text(t) for t in token_ids)


def token_text(token_id: int) -> str:
    index = token_id - _OUTPUT_VOCAB_BASE
    if 0 <= index < len(OUTPUT_WORDS):
        return " " + OUTPUT_WORDS[index]
    if token_id == EOS_TOKEN_ID:
        return ""
    return f" <{token_id}>"


def apply_chat_template(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """A Llama-3 style template: a shared system message yields a shared token prefix."""
    parts = ["<|begin_of_text|>"]
    for message in messages:
        parts.append(f"<|start_header_id|>{message.get('role', 'user')}<|end_header_id|>\n\n")
        parts.append(_content_text(message.get("content")))
        parts.append("<|eot_id|>")
    if add_generation_prompt:
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts; only text parts carry tokens here
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


class OutputStream:
    """Deterministic pseudo-text for one request: token ``i`` depends on (seed, prompt, i)."""

    __slots__ = ("_rng",)

    def __init__(self, seed: int, prompt_ids: Sequence[int], request_seed: int | None = None):
        key = zlib.crc32(str(len(prompt_ids)).encode() + bytes(str(prompt_ids[-64:]), "ascii"))
        self._rng = random.Random((seed << 32) ^ key ^ (request_seed or 0))

    def next_token(self) -> int:
        return _OUTPUT_VOCAB_BASE + int(self._rng.random() * len(OUTPUT_WORDS))

    def natural_length(self, low: int = 32, high: int = 512) -> int:
        """How many tokens the 'model' would write before its end-of-sequence token."""
        return self._rng.randint(low, high)
