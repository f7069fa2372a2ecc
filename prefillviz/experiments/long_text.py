"""Long prompts of real prose: *Alice's Adventures in Wonderland* (Lewis Carroll, 1865; public domain).

The text is ``assets/texts/alice_in_wonderland.txt`` (the whole book, from Project Gutenberg eBook
#11 without its header and licence, 144 KB, ~39k tokens of SmolLM2's tokenizer). A long prompt is
its first N tokens: prose that never repeats, since a prompt of repeated text makes attention look
sparser than it is (each token finds its copy one period back).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from prefillviz.engine.errors import ConfigError

LONG_TEXT_PATH = Path(__file__).resolve().parents[2] / "assets" / "texts" / "alice_in_wonderland.txt"
LONG_TEXT_NAME = "Alice's Adventures in Wonderland (Lewis Carroll, 1865; public domain)"


@lru_cache(maxsize=1)
def long_text() -> str:
    return LONG_TEXT_PATH.read_text(encoding="utf-8")


def long_prompt_ids(tokenizer, num_tokens: int) -> list[int]:
    """The first ``num_tokens`` token ids of the book.

    Raises:
        ConfigError: the book is shorter than ``num_tokens`` tokens of this tokenizer.
    """
    return long_prompts(tokenizer, num_tokens, 1)[0]


def long_prompts(tokenizer, num_tokens: int, count: int) -> list[list[int]]:
    """Up to ``count`` prompts of ``num_tokens`` token ids, the book's first stretches one after another (at least
    one; the book is tokenized once).

    Raises:
        ConfigError: the book is shorter than ``num_tokens`` tokens of this tokenizer.
    """
    ids = list(tokenizer(long_text())["input_ids"])
    if num_tokens > len(ids):
        raise ConfigError(f"{num_tokens:,} tokens is more than the bundled book has ({len(ids):,}) in this tokenizer.")
    return [ids[w * num_tokens : (w + 1) * num_tokens] for w in range(max(1, min(count, len(ids) // num_tokens)))]
