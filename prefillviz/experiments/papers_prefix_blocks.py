"""Prefix caching works in whole blocks, and saves the prefill only.

**Blocks.** Two requests share a prefix of L tokens, then differ. The first computes it; the
second finds in the cache only the prefix's *full* blocks (a block's hash covers all its tokens,
chained through the blocks before it; vLLM's ``hash_block_tokens``):

    block size 16, L = 15    [p p ... p x]          the block holds a token that differs: 0 hits
    block size 16, L = 16    [p p ... p p] [x ...]  one full block of prefix: 16 tokens hit
    block size 16, L = 40    [16 p][16 p][8 p x..]  32 of the 40 hit

so the hit rate over the shared prefix is floor(L / B)·B / L: a saw-tooth in L, with teeth as wide
as a block. Each (B, L) runs on a fresh engine, prefix cache on, one new token each.

**Long outputs.** A hit skips the prefix's prefill, so it shortens the time to first token; the
decode steps after it are the same. The more tokens a request generates, the smaller the share of
its whole time a hit saves. Measured on the Prefix cache page's stream (``experiments.prefix``:
the same request with the cache on and off, interleaved).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.request import SamplingParams
from prefillviz.experiments import prefix
from prefillviz.experiments.model_setup import device_and_dtype, model_tokenizer_and_id, token_ids_of_length
from prefillviz.loading.hosted import hosted_policy
from prefillviz.machine.progress import FractionProgress, ProgressCounter

SUFFIX_TOKENS = 8  # each request's own tokens after the shared prefix


def block_prompts(tokenizer, vocab_size: int, prefix_tokens: int) -> tuple[list[int], list[int]]:
    """Two prompts that share exactly their first ``prefix_tokens`` tokens of real prose, then differ."""
    text = token_ids_of_length(tokenizer, vocab_size, prefix_tokens + 3 * SUFFIX_TOKENS + 64)
    shared = text[:prefix_tokens]
    first = shared + text[-SUFFIX_TOKENS:]
    second_suffix = text[-2 * SUFFIX_TOKENS - 32 : -SUFFIX_TOKENS - 32]
    if second_suffix[0] == first[prefix_tokens]:  # they must differ right after the prefix
        second_suffix = [(second_suffix[0] + 1) % vocab_size] + second_suffix[1:]
    return first, shared + second_suffix


def cached_tokens_of_second(model, first: list[int], second: list[int], block_size: int) -> int:
    """Run ``first`` then ``second`` on one fresh engine (prefix cache on); the second's cached tokens."""
    blocks = -(-(len(first) + 1) // block_size) + -(-(len(second) + 1) // block_size) + 2
    config = EngineConfig(
        block_size=block_size, token_budget=max(len(first), len(second)), enable_prefix_caching=True, num_blocks=blocks,
        **hosted_policy().engine_limits(),
    )
    engine = LLMEngine(model, None, config)
    for request_id, prompt in (("first", first), ("second", second)):
        engine.add_request(prompt, SamplingParams(max_new_tokens=1), request_id=request_id)
        engine.run()
    return engine.trace().requests["second"].num_cached_tokens


@dataclass
class BlockHit:
    block_size: int
    prefix_tokens: int
    cached_tokens: int

    @property
    def hit_percent(self) -> float:
        """Share of the shared prefix served from the cache."""
        return 100 * self.cached_tokens / self.prefix_tokens

    @property
    def expected_tokens(self) -> int:
        """Whole blocks of the prefix: what a block-granular cache can hit."""
        return self.prefix_tokens // self.block_size * self.block_size


@dataclass
class BlockHitResult:
    model_id: str
    engine: str  # "ours" or vLLM's name
    points: list[BlockHit]

    def rows(self) -> list[dict]:
        return [
            {"engine": self.engine, "block_size": p.block_size, "shared_prefix_tokens": p.prefix_tokens,
             "cached_tokens": p.cached_tokens,
             "whole_blocks_x_block_size": p.expected_tokens, "hit_percent_of_prefix": p.hit_percent}
            for p in self.points
        ]

    def cached(self, block_size: int, prefix_tokens: int) -> int:
        return next(
            p.cached_tokens for p in self.points if p.block_size == block_size and p.prefix_tokens == prefix_tokens
        )


def prefix_lengths(block_sizes: list[int], num_blocks: int = 3) -> list[int]:
    """Lengths around every block edge of each block size (B-1, B, B+1 for B up to ``num_blocks`` blocks of the
    largest), plus a few between."""
    largest = max(block_sizes)
    lengths = {max(1, k * b + d) for b in block_sizes for k in range(1, num_blocks * largest // b + 1) for d in (-1, 0)}
    lengths |= {largest * num_blocks * i // 8 for i in range(1, 9)}
    return sorted(n for n in lengths if 1 <= n <= largest * num_blocks)


def check_block_sizes(block_sizes: list[int]) -> list[int]:
    sizes = sorted({int(b) for b in block_sizes})
    if not sizes or sizes[0] < 1:
        raise ConfigError("Pick at least one block size, a whole number >= 1.")
    return sizes


def run_block_hits(
    loaded_or_pair, block_sizes: list[int], lengths: list[int] | None = None, progress: FractionProgress | None = None
) -> BlockHitResult:
    """The second request's cached tokens for each block size and shared-prefix length (our engine).

    Raises:
        ConfigError: no block size, or one below 1.
    """
    model, tokenizer, model_id = model_tokenizer_and_id(loaded_or_pair)
    block_sizes = check_block_sizes(block_sizes)
    lengths = lengths or prefix_lengths(block_sizes)
    counter = ProgressCounter(progress, len(block_sizes) * len(lengths))
    points = []
    for b in block_sizes:
        for n in lengths:
            first, second = block_prompts(tokenizer, model.config.vocab_size, n)
            points.append(BlockHit(b, n, cached_tokens_of_second(model, first, second, b)))
            counter.advance(f"block size {b}, shared prefix {n} tokens")
    return BlockHitResult(model_id, "ours", points)


@dataclass
class LongOutputSaving:
    """One request that hits a shared prefix, with the cache on and off: what the hit saved."""

    model_id: str
    device: str
    dtype: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_on_ms: float
    ttft_off_ms: float
    total_on_ms: float  # arrival to its last token
    total_off_ms: float
    experiment: prefix.PrefixExperiment

    @property
    def ttft_saved_percent(self) -> float:
        return 100 * (self.ttft_off_ms - self.ttft_on_ms) / self.ttft_off_ms

    @property
    def total_saved_percent(self) -> float:
        return 100 * (self.total_off_ms - self.total_on_ms) / self.total_off_ms

    def curve(self) -> list[dict]:
        """The share of the request's time saved had it stopped after k tokens, k = 1..output tokens."""
        on, off = (self.experiment.cache_on.trace.requests["q2"], self.experiment.cache_off.trace.requests["q2"])
        rows, t_on, t_off = [], on.time_to_first_token_s, off.time_to_first_token_s
        for k in range(1, self.output_tokens + 1):
            if k > 1:
                t_on, t_off = t_on + on.inter_token_times_s[k - 2], t_off + off.inter_token_times_s[k - 2]
            rows.append({
                "output_tokens": k, "time_on_ms": t_on * 1000, "time_off_ms": t_off * 1000,
                "saved_percent": 100 * (t_off - t_on) / t_off,
            })
        return rows


def run_long_output_saving(
    model, tokenizer, prefix_tokens: int, output_tokens: int, model_id: str = "", progress=None
) -> LongOutputSaving:
    """Two questions on the first ``prefix_tokens`` of the Prefix cache page's document, ``output_tokens``
    new tokens each, cache on and off; the second question's TTFT and whole time, both ways."""
    prefix_text, template = prefix.SHARED_PREFIXES["Questions about one long document"]
    ids = tokenizer(prefix_text)["input_ids"]
    if prefix_tokens < len(ids):
        prefix_text = tokenizer.decode(ids[:prefix_tokens])
    stream = prefix.build_stream(
        tokenizer, prefix_text, list(prefix.QUESTIONS[:2]), template, output_tokens, other_user_after=None
    )
    experiment = prefix.run_prefix_experiment(model, stream, None, progress, model_id)
    on, off = experiment.cache_on.trace.requests["q2"], experiment.cache_off.trace.requests["q2"]

    def total_ms(record) -> float:
        return (record.time_to_first_token_s + sum(record.inter_token_times_s)) * 1000

    device, dtype = device_and_dtype(model)
    return LongOutputSaving(
        model_id, device, dtype, on.num_prompt_tokens, on.num_cached_tokens, len(on.output_token_ids),
        on.time_to_first_token_s * 1000,
        off.time_to_first_token_s * 1000, total_ms(on), total_ms(off), experiment,
    )


def median_itl_ms(saving: LongOutputSaving) -> float:
    gaps = saving.experiment.cache_on.trace.requests["q2"].inter_token_times_s
    return statistics.median(gaps) * 1000 if gaps else float("nan")
