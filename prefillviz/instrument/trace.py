"""What a run leaves behind: plain dataclasses the UI, the CLI and the tests read.

A ``Trace`` is one ``StepRecord`` per engine step plus one ``RequestRecord`` per request.
Nothing in it points at a live module; ``to_dict`` gives JSON-ready data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from prefillviz.engine.scheduler import ScheduledChunk


@dataclass
class StepRecord:
    step_index: int
    chunks: list[ScheduledChunk]  # batch order; each is a prefill chunk or a decode token
    blocks_hit: dict[str, list[int]]
    blocks_allocated: dict[str, list[int]]
    blocks_evicted: list[int]
    preempted_request_ids: list[str]
    sampled_token_ids: dict[str, int]
    num_free_blocks: int  # after the step
    start_time_s: float  # since the engine's first step
    wall_time_s: float  # schedule + prepare + forward + sample + update (device synchronized)
    schedule_time_s: float
    prepare_time_s: float
    forward_time_s: float
    sample_time_s: float
    update_time_s: float

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks if chunk.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return self.num_scheduled_tokens - self.num_prefill_tokens


@dataclass
class RequestRecord:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    status: str
    num_cached_tokens: int
    num_preemptions: int
    arrival_time_s: float  # since the engine's first step (negative: added before it)
    tokenize_time_s: float
    time_to_first_token_s: float | None
    inter_token_times_s: list[float]
    first_token_top_ids: list[int] = field(default_factory=list)
    first_token_top_probs: list[float] = field(default_factory=list)
    first_token_entropy_nats: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class Trace:
    model_id: str
    device: str
    dtype: str
    engine_config: dict
    num_blocks: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    steps: list[StepRecord] = field(default_factory=list)
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    prefix_cache_queries: int = 0  # tokens looked up (vLLM's counter names)
    prefix_cache_hits: int = 0  # tokens found

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def to_dict(self) -> dict:
        data = asdict(self)
        for step, record in zip(data["steps"], self.steps):
            step["num_scheduled_tokens"] = record.num_scheduled_tokens
        return data
