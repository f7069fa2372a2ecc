"""One request as it flows through the engine (vLLM v1 ``Request``, nano-vllm ``Sequence``).

The scheduler fills it (blocks, ``num_computed_tokens``), the runner reads it (which tokens
to feed, where their KV goes), and ``Scheduler.update`` advances it (sampled tokens, hashes,
timestamps). There is no prefill or decode *phase* stored anywhere: a request is
"prefilling" exactly while ``num_computed_tokens < num_prompt_tokens``.

    token ids:  [ prompt ........................ | outputs ... ]
                 ^ computed (KV in cache) ^      ^ num_tokens
                 0          num_computed_tokens
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # blocks taken back; waits to be recomputed from token 0
    FINISHED_LENGTH = "finished_length"  # reached max_new_tokens
    FINISHED_STOPPED = "finished_stopped"  # sampled a stop token
    FINISHED_ABORTED = "finished_aborted"  # failed or cancelled; its blocks were freed

    @property
    def is_finished(self) -> bool:
        return self.value.startswith("finished")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. ``temperature == 0`` is greedy."""

    max_new_tokens: int = 1
    temperature: float = 0.0
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class SampleResult:
    """The token the sampler picked, and the distribution it came from (``engine.sampler``)."""

    token_id: int
    top_token_ids: list[int]  # most likely first, from softmax(logits)
    top_probs: list[float]
    entropy_nats: float


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0
    tokenize_time_s: float = 0.0  # text -> ids, before arrival
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, how many came from prefix-cache hits (first admission)
    block_table: list[int] = field(default_factory=list)  # logical block i -> physical block id
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per output token
    finished_time: float | None = None
    generator: torch.Generator | None = None  # per-request RNG when a seed is given
    # the first token, kept by the engine in the step that samples it (the app's first-token views)
    first_token_sample: SampleResult | None = None  # the token and its distribution (top tokens, entropy)
    first_token_logits: torch.Tensor | None = None  # (V,) fp32 on CPU
    first_token_text: str | None = None  # detokenized; None without a tokenizer
    detokenize_time_s: float = 0.0  # the decode of that text, after the step

    @classmethod
    def prefilled(
        cls, request_id: str, token_ids: list[int], params: SamplingParams, first_token_id: int, block_table: list[int],
        arrival_time: float, first_token_time: float,
    ) -> Request:
        """A request whose prompt another engine computed: running, its first token sampled (disaggregation)."""
        return cls(
            request_id=request_id, prompt_token_ids=token_ids, sampling_params=params, arrival_time=arrival_time,
            output_token_ids=[first_token_id], status=RequestStatus.RUNNING, num_computed_tokens=len(token_ids),
            block_table=block_table, first_scheduled_time=arrival_time, first_token_time=first_token_time,
            token_times=[first_token_time],
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def time_to_first_token_s(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def inter_token_times_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]
