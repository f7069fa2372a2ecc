"""Prefix caching: a stream of requests that share a prefix, run one after another on ONE engine.

Every request is ``shared prefix + its own turn``. The first request computes the prefix and
caches its full blocks (chained hashes); every later one finds them and starts
``num_computed_tokens`` after them, so only its own turn is prefilled:

    block size 16, shared prefix 70 tokens = 4 full blocks + 6 tokens
    q1   [C][C][C][C][C][C][p]      C computed, p partial (the prompt ends inside it)
    q2   [H][H][H][H][C][C][p]      H hit: K/V reused, never run again
         '----------' 64 tokens: the prefix's full blocks (its last 6 tokens share a block
                      with the question, whose hash differs, so they are computed again)

Three runs of the same stream on three engines, interleaved request by request (so a burst of
load on a shared machine hits all three alike), greedy, timing pass (capture "none"):

    cache on      an ample cache (room for every request's blocks): nothing is ever evicted
    cache off     nothing is reused: the misses to compare TTFT with
    small cache   ``EngineConfig(num_blocks=small)``: allocating blocks evicts cached ones
                  (least recently freed first), and a request that comes after another
                  user's long prompt may find its prefix gone

The counters are vLLM's: ``prefix_cache_queries`` (prompt tokens looked up) and
``prefix_cache_hits`` (tokens found), read after each request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import RequestError
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.trace import Trace
from prefillviz.experiments.warm_up import short_warm_up
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.prompts import PRESETS
from prefillviz.machine.progress import StepProgress, offset_progress

_CHAT = PRESETS["Chat with a system prompt"]
CHAT_SYSTEM_PROMPT = (
    _CHAT[: _CHAT.index("<|im_end|>")]
    + " Use an everyday example in every answer, define each technical word the first time you use it, "
    "and end with one short question that checks the student understood. If a question is not about "
    "computer science, answer it briefly and steer back to the topic.<|im_end|>\n"
)
DOCUMENT = PRESETS["Long document"][: PRESETS["Long document"].rindex("Summary")].rstrip() + "\n\n"

SHARED_PREFIXES = {
    # name: (shared prefix, the template of each request's own turn)
    "Chat: one system prompt, many users": (
        CHAT_SYSTEM_PROMPT, "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    ),
    "Questions about one long document": (DOCUMENT, "Question: {}\nAnswer:"),
}
QUESTIONS = (
    "Why does a language model answer faster after it has read my question once?",
    "What is a cache, and why do computers use so many of them?",
    "How can a graphics card do thousands of calculations at the same time?",
    "Why do computers store numbers in binary?",
)
OTHER_USER_PROMPT = PRESETS["Code"]  # another user's request, with a prefix of its own
OTHER_REQUEST_ID = "other user"


@dataclass(frozen=True)
class PrefixStream:
    """Requests in arrival order; those named q1, q2, ... start with the shared prefix.

    Attributes:
        prompts: (request id, prompt token ids) in the order they arrive.
        num_shared_prefix_tokens: how many leading tokens the q requests share.
        max_new_tokens: tokens each request generates (greedy).
        block_size: tokens per KV block.
    """

    prompts: tuple[tuple[str, tuple[int, ...]], ...]
    num_shared_prefix_tokens: int
    max_new_tokens: int = 6
    block_size: int = 16

    def __post_init__(self) -> None:
        EngineConfig(block_size=self.block_size)  # a block size that is not a positive whole number fails here
        if not self.prompts:
            raise RequestError("The stream is empty: give at least one question.")
        if self.max_new_tokens < 1:
            raise RequestError(f"Each request needs at least 1 new token, got {self.max_new_tokens}.")

    @property
    def request_ids(self) -> list[str]:
        return [request_id for request_id, _ in self.prompts]

    @property
    def num_shared_full_blocks(self) -> int:
        return self.num_shared_prefix_tokens // self.block_size

    def blocks_needed(self, prompt: tuple[int, ...]) -> int:
        return math.ceil((len(prompt) + self.max_new_tokens) / self.block_size)

    @property
    def ample_num_blocks(self) -> int:
        """Room for every request's blocks at once: a cached block is never evicted."""
        return sum(self.blocks_needed(prompt) for _, prompt in self.prompts)

    @property
    def min_num_blocks(self) -> int:
        """The smallest KV cache (in blocks) that can serve every request of the stream alone."""
        return max(self.blocks_needed(prompt) for _, prompt in self.prompts)

    def engine_config(self, enable_prefix_caching: bool, num_blocks: int | None = None) -> EngineConfig:
        """``num_blocks`` None: the ample cache. In hosted mode, with the demo's request limits."""
        return EngineConfig(
            block_size=self.block_size,
            enable_prefix_caching=enable_prefix_caching,
            num_blocks=self.ample_num_blocks if num_blocks is None else num_blocks,
            **hosted_policy().engine_limits(),
        )


def build_stream(
    tokenizer,
    shared_prefix: str,
    questions: list[str],
    turn_template: str = "{}",
    max_new_tokens: int = 6,
    block_size: int = 16,
    other_user_after: int | None = 2,
) -> PrefixStream:
    """Tokenize ``shared_prefix`` once and each question's turn on its own, so every q request
    starts with exactly the same prefix tokens.

    Args:
        other_user_after: insert another user's request (the "Code" preset) after this many
            questions; None for none.

    Raises:
        RequestError: an empty prefix, or no non-empty question.
        ConfigError: a block size that is not a positive whole number.
    """
    questions = [q.strip() for q in questions if q.strip()]
    if not shared_prefix.strip():
        raise RequestError("The shared prefix is empty: type the text every request starts with.")
    if not questions:
        raise RequestError("No questions: write at least one, one per line.")
    prefix_ids = tuple(tokenizer(shared_prefix)["input_ids"])
    prompts = []
    for i, question in enumerate(questions):
        turn_ids = tuple(tokenizer(turn_template.format(question), add_special_tokens=False)["input_ids"])
        prompts.append((f"q{i + 1}", prefix_ids + turn_ids))  # q1, q2, ...: the questions on the shared prefix
        if other_user_after is not None and i + 1 == other_user_after and i + 1 < len(questions):
            prompts.append((OTHER_REQUEST_ID, tuple(tokenizer(OTHER_USER_PROMPT)["input_ids"])))
    return PrefixStream(tuple(prompts), len(prefix_ids), max_new_tokens, block_size)


@dataclass
class RequestBlocks:
    """One request's prompt blocks and what prefix caching did with each."""

    request_id: str
    physical_blocks: list[int]  # logical block i -> physical block id (prompt blocks only)
    statuses: list[str]  # "hit" | "computed" | "partial" (the prompt ends inside the block)
    num_prompt_tokens: int
    num_cached_tokens: int


def request_blocks(trace: Trace, request_id: str) -> RequestBlocks:
    """A request's prompt blocks in a trace (ours or a peer's): the physical block of each, in
    the order its steps took them (hits, then allocations), and what caching did with each."""
    record = trace.requests[request_id]
    block_size = trace.engine_config["block_size"]
    physical: list[int] = []
    for step in trace.steps:
        physical += step.blocks_hit.get(request_id, []) + step.blocks_allocated.get(request_id, [])
    num_blocks = math.ceil(record.num_prompt_tokens / block_size)
    num_hit = record.num_cached_tokens // block_size
    statuses = [
        "hit" if i < num_hit else "computed" if (i + 1) * block_size <= record.num_prompt_tokens else "partial"
        for i in range(num_blocks)
    ]
    return RequestBlocks(
        request_id, physical[:num_blocks], statuses, record.num_prompt_tokens, record.num_cached_tokens
    )


@dataclass
class StreamRun:
    label: str  # "cache on", "cache off", "small cache"
    enable_prefix_caching: bool
    num_blocks: int
    trace: Trace
    counters: list[tuple[int, int]]  # cumulative (prefix_cache_queries, prefix_cache_hits) after each request
    request_steps: dict[str, list[int]]  # step indices each request ran in

    def request_blocks(self, request_id: str) -> RequestBlocks:
        return request_blocks(self.trace, request_id)

    def evictions(self) -> list[tuple[int, str, list[int]]]:
        """(step index, the request that step ran for, evicted block ids) for every step."""
        owner = {index: request_id for request_id, indices in self.request_steps.items() for index in indices}
        return [(step.step_index, owner[step.step_index], list(step.blocks_evicted)) for step in self.trace.steps]


class StreamRunner:
    """One engine serving the stream one request at a time (each finishes before the next arrives).

    Args:
        num_blocks: KV cache size in blocks (None: ample, room for every request's blocks at once).
    """

    def __init__(
        self, model, stream: PrefixStream, enable_prefix_caching: bool, num_blocks: int | None, label: str,
        model_id: str = "",
    ) -> None:
        self.engine = LLMEngine(model, None, stream.engine_config(enable_prefix_caching, num_blocks), model_id=model_id)
        self.params = SamplingParams(max_new_tokens=stream.max_new_tokens)
        self.label, self.enable_prefix_caching = label, enable_prefix_caching
        self.counters: list[tuple[int, int]] = []
        self.request_steps: dict[str, list[int]] = {}

    def serve(self, request_id: str, prompt: tuple[int, ...], progress: StepProgress | None = None) -> int:
        """Add one request and step until it is done; returns the steps it took.

        Raises:
            RequestError: the request does not fit the cache.
        """
        engine, first = self.engine, len(self.engine.steps)
        engine.add_request(list(prompt), self.params, request_id=request_id)
        engine.run(progress=progress)
        self.request_steps[request_id] = list(range(first, len(engine.steps)))
        self.counters.append((engine.scheduler.prefix_cache_queries, engine.scheduler.prefix_cache_hits))
        return len(engine.steps) - first

    def result(self) -> StreamRun:
        return StreamRun(
            self.label, self.enable_prefix_caching, self.engine.num_blocks, self.engine.trace(), self.counters,
            self.request_steps,
        )


@dataclass
class PrefixExperiment:
    stream: PrefixStream
    model_id: str
    device: str
    dtype: str
    cache_on: StreamRun
    cache_off: StreamRun
    small_cache: StreamRun | None

    @property
    def runs(self) -> list[StreamRun]:
        return [run for run in (self.cache_on, self.cache_off, self.small_cache) if run is not None]

    def lost_hits(self) -> list[tuple[str, int, int]]:
        """(request id, cached tokens with ample memory, cached tokens in the small cache)."""
        if self.small_cache is None:
            return []
        ample, small = self.cache_on.trace.requests, self.small_cache.trace.requests
        return [(rid, ample[rid].num_cached_tokens, small[rid].num_cached_tokens) for rid in self.stream.request_ids]


def estimated_num_steps(stream: PrefixStream, small_cache: bool) -> int:
    return len(stream.prompts) * stream.max_new_tokens * (3 if small_cache else 2)


def run_prefix_experiment(
    model, stream: PrefixStream, small_num_blocks: int | None = None, progress: StepProgress | None = None,
    model_id: str = "",
) -> PrefixExperiment:
    """Warm up, then run the stream with the cache on, off, and (if ``small_num_blocks``) in a small cache.

    Three engines, interleaved request by request: each request runs on every engine before the
    next one arrives, so a burst of load on a shared machine hits all three runs alike.
    ``progress`` counts steps across the runs.

    Raises:
        RequestError: ``small_num_blocks`` too small for one of the requests.
        ConfigError: ``small_num_blocks`` not a positive whole number.
    """
    if small_num_blocks is not None:
        stream.engine_config(True, small_num_blocks)  # validate before spending time on the other runs
        if small_num_blocks < stream.min_num_blocks:
            raise RequestError(
                f"A cache of {small_num_blocks} blocks is too small: the longest request needs {stream.min_num_blocks} "
                f"blocks of {stream.block_size} tokens."
            )
    short_warm_up(model)
    runners = [
        StreamRunner(model, stream, True, None, "cache on", model_id),
        StreamRunner(model, stream, False, None, "cache off", model_id),
    ]
    if small_num_blocks is not None:
        runners.append(StreamRunner(model, stream, True, small_num_blocks, "small cache", model_id))
    done = 0
    for request_id, prompt in stream.prompts:  # interleaved: the runs of one request see the same machine load
        for runner in runners:
            done += runner.serve(request_id, prompt, offset_progress(progress, done))
    runs = [runner.result() for runner in runners] + [None] * (3 - len(runners))
    return PrefixExperiment(stream, model_id, runs[0].trace.device, runs[0].trace.dtype, *runs)
