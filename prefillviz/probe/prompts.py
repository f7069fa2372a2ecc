"""Prompts of a chosen length that no prefix cache can help with, for a tokenizer we don't have.

Each prompt starts with its own random tag and goes on with random common words, so two
prompts share no first block and a server's prefix cache finds nothing. The server's
tokenizer is unknown here, so ``PromptMaker`` first asks the server how many tokens a
calibration text has (``usage.prompt_tokens``) and sizes prompts by that ratio; each
measurement then reports the server's own count of the tokens it got.
"""

from __future__ import annotations

import random
import secrets

WORDS = (
    "the of and to in is was for on with as by at from that this which it be are not have had one "
    "all were when there can an been more their time would so some what about out up into who them "
    "then only its other new first over after also many most these may two could way any people made "
    "well long such even back water day just through where much before right down should because each "
    "those while state year work part under city world three high house small large place number "
    "between both since great every country never family under school point river light open road"
).split()
CALIBRATION_WORDS = 200


def unique_words(num_words: int, rng: random.Random) -> str:
    """A run of random common words behind a random tag (the tag is what makes it unique)."""
    tag = secrets.token_hex(4)
    return f"[{tag}] " + " ".join(rng.choice(WORDS) for _ in range(max(1, num_words)))


class PromptMaker:
    """Unique prompts of about ``num_tokens`` tokens, once ``tokens_per_word`` is known."""

    def __init__(self, tokens_per_word: float, seed: int | None = None) -> None:
        self.tokens_per_word = max(tokens_per_word, 0.05)
        self.rng = random.Random(seed)

    def words_for(self, num_tokens: int) -> int:
        return max(1, round((num_tokens - 6) / self.tokens_per_word))  # about 6 tokens for the tag

    def prompt(self, num_tokens: int) -> str:
        return unique_words(self.words_for(num_tokens), self.rng)

    def suffix(self, num_tokens: int) -> str:
        """Text to append after a shared prefix (it starts with its own tag too)."""
        return " " + unique_words(self.words_for(num_tokens), self.rng)


def calibration_prompt(seed: int | None = None) -> tuple[str, int]:
    """A unique text and its number of words (``CALIBRATION_WORDS`` plus the tag)."""
    return unique_words(CALIBRATION_WORDS, random.Random(seed)), CALIBRATION_WORDS
