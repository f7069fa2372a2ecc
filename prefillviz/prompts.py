"""Preset prompts and a deterministic long text for benchmarks (N tokens of real prose)."""

from __future__ import annotations

BENCH_TEXT = (
    "Prefill is the first phase of inference for a large language model. The model reads the whole "
    "prompt in one forward pass, computes keys and values for every token in every layer, stores them "
    "in the KV cache, and produces a probability distribution over the next token. Because all prompt "
    "tokens are known in advance, the work is done as large matrix multiplications that keep the "
    "compute units busy. Decode then generates one token at a time, reading the cache it filled. "
)


def bench_token_ids(tokenizer, num_tokens: int) -> list[int]:
    """Exactly ``num_tokens`` token ids of real prose (the text repeated as needed)."""
    unit = tokenizer(BENCH_TEXT)["input_ids"]
    repeats = -(-num_tokens // len(unit))
    return (unit * repeats)[:num_tokens]
