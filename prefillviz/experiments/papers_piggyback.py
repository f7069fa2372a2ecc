"""Decodes ride along a prefill almost for free (Sarathi-Serve, OSDI'24, Table 2).

Three kinds of engine step, each timed on a fresh engine, interleaved run by run so a burst of load
on a shared machine hits all three alike (timing pass, capture "none"):

    decode-only    [d d d d]                      4 users decoding, nothing else
    prefill alone  [P P P ... P]                  one prompt chunk of C tokens
    mixed          [P P ... P d d d]              C-3 prompt tokens + 3 users' decode tokens

A decode step reads every weight of the model to produce 4 tokens; the mixed step reads them once
for C tokens. Time per token = step time / tokens in the step (the paper's ``per_token_time``): a
decode token riding in the mixed step costs what a prompt token costs there, not what it costs in
a decode-only step. Each step's time is the engine's ``wall_time_s`` (schedule, forward, sample).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import RequestError
from prefillviz.engine.request import SamplingParams
from prefillviz.experiments.model_setup import device_and_dtype, model_tokenizer_and_id, token_ids_of_length
from prefillviz.experiments.warm_up import short_warm_up
from prefillviz.loading.hosted import hosted_policy
from prefillviz.machine.progress import FractionProgress, ProgressCounter

NUM_DECODES = 4  # the decode-only batch (the paper's)
NUM_PIGGYBACKED = 3  # decodes in the mixed step (the paper's 1021 + 3)
SHORT_PROMPT_TOKENS = 16  # each decoding user's prompt


def _engine(model, token_budget: int, num_tokens: int) -> LLMEngine:
    config = EngineConfig(
        token_budget=token_budget, enable_prefix_caching=False, num_blocks=num_tokens // 16 + 8,
        **hosted_policy().engine_limits(),
    )
    return LLMEngine(model, None, config)


def _decoding_users(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> None:
    """Add the users and run until each has its first token (their prefills), so the next step decodes."""
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, SamplingParams(max_new_tokens=new_tokens), request_id=f"user-{i + 1}")
    sampled: set[str] = set()
    while len(sampled) < len(prompts):  # their prompts (one step when the budget holds them all)
        sampled.update(engine.step().sampled_token_ids)


def decode_only_step_s(model, prompts: list[list[int]]) -> float:
    """One decode-only step of ``len(prompts)`` users (their second token), seconds."""
    engine = _engine(model, 4096, SHORT_PROMPT_TOKENS * 8 + 64)  # the budget holds every prompt
    _decoding_users(engine, prompts, 3)
    step = engine.step()
    assert step.num_prefill_tokens == 0 and step.num_decode_tokens == len(prompts)
    return step.wall_time_s


def prefill_step_s(model, prompt: list[int]) -> float:
    """One step prefilling ``prompt`` whole (a chunk of C tokens alone), seconds."""
    engine = _engine(model, len(prompt), len(prompt) + 64)
    engine.add_request(prompt, SamplingParams(max_new_tokens=1), request_id="prompt")
    step = engine.step()
    assert step.num_prefill_tokens == len(prompt) and step.num_decode_tokens == 0
    return step.wall_time_s


def mixed_step_s(model, users: list[list[int]], prompt: list[int]) -> float:
    """One step of ``prompt`` (C - k tokens) and k users' decode tokens, budget C, seconds."""
    budget = len(prompt) + len(users)
    engine = _engine(model, budget, budget + SHORT_PROMPT_TOKENS * 8 + 64)
    _decoding_users(engine, users, 64)  # still decoding whatever chunks their own prompts took (a small C)
    engine.add_request(prompt, SamplingParams(max_new_tokens=1), request_id="prompt")
    step = engine.step()  # decodes first, then the prompt gets the rest of the budget: all of it
    assert step.num_prefill_tokens == len(prompt) and step.num_decode_tokens == len(users)
    return step.wall_time_s


@dataclass
class PiggybackResult:
    """Median step times of the three kinds of step (ms), and their times per token."""

    model_id: str
    device: str
    dtype: str
    chunk_tokens: int  # C
    runs: int
    decode_only_ms: float
    prefill_alone_ms: float
    mixed_ms: float
    runs_ms: dict[str, list[float]]

    @property
    def decode_only_per_token_ms(self) -> float:
        return self.decode_only_ms / NUM_DECODES

    @property
    def prefill_alone_per_token_ms(self) -> float:
        return self.prefill_alone_ms / self.chunk_tokens

    @property
    def mixed_per_token_ms(self) -> float:
        return self.mixed_ms / self.chunk_tokens

    @property
    def ratio(self) -> float:
        """A decode token's cost in a decode-only step over its cost riding in the mixed step."""
        return self.decode_only_per_token_ms / self.mixed_per_token_ms

    @property
    def mixed_over_prefill(self) -> float:
        """The mixed step's time over the prefill-alone step's (same C tokens): what swapping 3 prompt tokens
        for 3 decodes costs."""
        return self.mixed_ms / self.prefill_alone_ms

    def rows(self) -> list[dict]:
        c, k = self.chunk_tokens, NUM_PIGGYBACKED
        return [
            {
                "batch": f"decode-only ({NUM_DECODES} decodes)", "prefill_tokens": 0, "decode_tokens": NUM_DECODES,
                "step_ms": self.decode_only_ms, "per_token_ms": self.decode_only_per_token_ms,
            },
            {
                "batch": f"prefill alone ({c} tokens)", "prefill_tokens": c, "decode_tokens": 0,
                "step_ms": self.prefill_alone_ms, "per_token_ms": self.prefill_alone_per_token_ms,
            },
            {
                "batch": f"mixed ({c - k} prefill + {k} decodes)", "prefill_tokens": c - k, "decode_tokens": k,
                "step_ms": self.mixed_ms, "per_token_ms": self.mixed_per_token_ms,
            },
        ]


def run_piggyback(
    loaded_or_pair, chunk_tokens: int = 512, runs: int = 3, progress: FractionProgress | None = None
) -> PiggybackResult:
    """Time the three steps ``runs`` times each (after one untimed round), interleaved; medians.

    Raises:
        RequestError: a chunk too small to hold the 3 decodes and a prompt token.
    """
    if chunk_tokens <= NUM_PIGGYBACKED:
        raise RequestError(
            f"The chunk must hold the {NUM_PIGGYBACKED} decodes and at least one prompt token: "
            f"pick C > {NUM_PIGGYBACKED}."
        )
    model, tokenizer, model_id = model_tokenizer_and_id(loaded_or_pair)
    vocab_size = model.config.vocab_size
    text = token_ids_of_length(tokenizer, vocab_size, chunk_tokens + SHORT_PROMPT_TOKENS * NUM_DECODES)
    users = [
        text[chunk_tokens + i * SHORT_PROMPT_TOKENS : chunk_tokens + (i + 1) * SHORT_PROMPT_TOKENS]
        for i in range(NUM_DECODES)
    ]
    counter = ProgressCounter(progress, 3 * (runs + 1))
    short_warm_up(model)
    times: dict[str, list[float]] = {"decode-only": [], "prefill alone": [], "mixed": []}
    for run in range(runs + 1):  # round 0 warms each shape up
        measured = {
            "decode-only": decode_only_step_s(model, users),
            "prefill alone": prefill_step_s(model, text[:chunk_tokens]),
            "mixed": mixed_step_s(model, users[:NUM_PIGGYBACKED], text[: chunk_tokens - NUM_PIGGYBACKED]),
        }
        for name, seconds in measured.items():
            if run > 0:
                times[name].append(seconds * 1000)
            counter.advance(f"round {run + 1} of {runs + 1} (the first warms up): {name}")
    medians = {name: statistics.median(values) for name, values in times.items()}
    return PiggybackResult(
        model_id, *device_and_dtype(model), chunk_tokens, runs, medians["decode-only"], medians["prefill alone"],
        medians["mixed"], times
    )
