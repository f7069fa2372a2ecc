"""The runs a replay plays back: three real runs of the engine, each kept as its trace.

Nothing here runs the engine its own way: every run goes through the experiment the pages use.

    prefill vs token by token   ``one_request.run_one`` twice on the same N-token prompt, at capture
                                level ``inspect`` (KV write log, per-layer clocks, q/k for the one
                                step's attention maps): budget N, then 1
    chunked prefill             ``chunked.run_workload``, chunking on: short requests decoding, the
                                N-token prompt arriving and chunked into the budget (timing pass)
    prefix-cache hit            ``prefix.StreamRunner``, cache on: two questions on one system prompt,
                                the second hits the first's blocks (timing pass)

``figures.replay`` turns the traces into frames and one HTML file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prefillviz.engine.errors import RequestError
from prefillviz.engine.trace import Trace
from prefillviz.experiments.chunked import build_workload, run_workload
from prefillviz.experiments.one_request import run_one
from prefillviz.experiments.prefix import CHAT_SYSTEM_PROMPT, QUESTIONS, SHARED_PREFIXES, StreamRunner, build_stream
from prefillviz.experiments.warm_up import short_warm_up
from prefillviz.loading.models import LoadedModel
from prefillviz.loading.prompts import bench_token_ids
from prefillviz.machine.progress import FractionProgress

MIN_REPLAY_TOKENS = 2  # token by token needs a step before the last
MAX_REPLAY_TOKENS = 2048  # the page's and the file's grid stay readable (and the file small) up to here
PREFIX_QUESTIONS = QUESTIONS[:2]  # the first computes the system prompt, the second hits it


@dataclass
class ReplayRuns:
    """The traces a replay is built from, and what names their tokens.

    Attributes:
        model_id, device, dtype: what ran.
        num_tokens: the prompt length of the first two runs (and of the chunked run's long prompt).
        parallel, token_by_token: the same prompt, budget N and budget 1 (inspection pass).
        chunked: the chunked-prefill workload, chunking on (timing pass).
        prefix: the prefix-cache stream, cache on (timing pass).
        token_text: token id -> its text, for every token of the four runs.
        record_s: seconds the four runs took, warm-up included.
    """

    model_id: str
    device: str
    dtype: str
    num_tokens: int
    parallel: Trace
    token_by_token: Trace
    chunked: Trace
    prefix: Trace
    token_text: dict[int, str] = field(default_factory=dict)
    record_s: float = 0.0


def check_num_tokens(num_tokens: int, max_context: int | None = None) -> None:
    """Refuse a replay length the runs can't make (before any run starts).

    Raises:
        RequestError: below ``MIN_REPLAY_TOKENS``, above ``MAX_REPLAY_TOKENS`` or past the model's context.
    """
    largest = min(MAX_REPLAY_TOKENS, (max_context - 4) if max_context else MAX_REPLAY_TOKENS)
    if not MIN_REPLAY_TOKENS <= num_tokens <= largest:
        raise RequestError(
            f"A replay needs between {MIN_REPLAY_TOKENS} and {largest:,} prompt tokens, got {num_tokens:,}."
        )


def texts_of(tokenizer: Any, traces: list[Trace]) -> dict[int, str]:
    """Every token id of the traces' requests (prompts and outputs), decoded on its own."""
    ids = {token for trace in traces for record in trace.requests.values()
           for token in record.prompt_token_ids + record.output_token_ids}
    if tokenizer is None:
        return {token: str(token) for token in ids}
    return {token: tokenizer.decode([token]) for token in sorted(ids)}


def record_replay(
    loaded: LoadedModel, num_tokens: int, progress: FractionProgress | None = None
) -> ReplayRuns:
    """Run the three scenes on ``loaded`` (warm-up first, so no run is a cold one).

    Args:
        loaded: the model.
        num_tokens: the prompt length of the prefill runs and of the chunked run's long prompt.
        progress: told (fraction done, what runs now) before each run.

    Raises:
        RequestError: a ``num_tokens`` the runs can't make (``check_num_tokens``).
    """
    check_num_tokens(num_tokens, loaded.info.max_context)
    started = time.perf_counter()
    say = progress or (lambda fraction, what: None)
    model, tokenizer, model_id = loaded.model, loaded.tokenizer, loaded.model_id
    say(0.0, "Warming up")
    short_warm_up(model)
    prompt = bench_token_ids(tokenizer, num_tokens)
    say(0.05, f"Prefill of {num_tokens} tokens in one step (inspection pass)")
    parallel, _ = run_one(model, tokenizer, prompt, num_tokens, "inspect", model_id=model_id)
    one_by_one = f"The same {num_tokens} tokens one per step (inspection pass)"
    say(0.1, one_by_one)

    def step_done(done: int, _record) -> None:
        if done % 32 == 0:
            say(0.1 + 0.7 * done / num_tokens, f"{one_by_one}: step {done} of {num_tokens}")

    token_by_token, _ = run_one(model, tokenizer, prompt, 1, "inspect", progress=step_done, model_id=model_id)
    say(0.8, "Chunked prefill beside decoding requests (timing pass)")
    chunked = run_workload(model, build_workload(tokenizer, long_prompt_tokens=num_tokens), True, model_id=model_id)
    say(0.9, "Two questions on one system prompt, prefix cache on (timing pass)")
    chat_template = SHARED_PREFIXES["Chat: one system prompt, many users"][1]
    stream = build_stream(tokenizer, CHAT_SYSTEM_PROMPT, list(PREFIX_QUESTIONS), chat_template, max_new_tokens=4,
                          other_user_after=None)
    runner = StreamRunner(model, stream, True, None, "cache on", model_id)
    for request_id, prompt_ids in stream.prompts:
        runner.serve(request_id, prompt_ids)
    prefix = runner.result().trace
    traces = [parallel, token_by_token, chunked, prefix]
    say(1.0, "Recorded")
    return ReplayRuns(
        model_id, parallel.device, parallel.dtype, num_tokens, parallel, token_by_token, chunked, prefix,
        texts_of(tokenizer, traces), time.perf_counter() - started,
    )
