"""What a run leaves behind: plain dataclasses the UI, the CLI and the tests read.

A ``Trace`` is one ``StepRecord`` per engine step plus one ``RequestRecord`` per request.
Nothing in it points at a live module: arrays are numpy, and ``trace_io`` saves it as
JSON plus an NPZ of the arrays.
"""

from __future__ import annotations

import gzip
from dataclasses import asdict, dataclass, field

import numpy as np

from prefillviz.engine.scheduler import ScheduledChunk

CAPTURE_LEVELS = ("none", "timing", "inspect", "profile")
"""none: step times only. timing: + per-layer and sub-layer times. inspect: + KV write log,
queries and keys, hidden-state norms. profile: timing under torch.profiler (slower; its
numbers are labelled as such)."""


@dataclass
class LayerTimes:
    """Wall time of each part of one forward (one step), per decoder layer.

    ``other_s`` per layer is the layer's total minus attention, MLP and norms (residual
    adds, rotary embedding). ``clock`` says how it was read.
    """

    clock: str  # "perf_counter" (CPU) or "cuda events"
    attention_s: list[float]  # (L,) attention module: projections, RoPE, KV write, SDPA
    mlp_s: list[float]  # (L,)
    norms_s: list[float]  # (L,)
    layer_s: list[float]  # (L,) whole decoder layer
    embedding_s: float
    final_norm_s: float
    lm_head_s: float

    @property
    def other_s(self) -> list[float]:
        return [t - a - m - n for t, a, m, n in zip(self.layer_s, self.attention_s, self.mlp_s, self.norms_s)]


@dataclass
class KVWriteRecord:
    """What one step wrote into the paged KV cache (the same slots in every layer)."""

    positions: np.ndarray  # (T,) token position within its request
    slots: np.ndarray  # (T,) cache slot = block * block_size + offset
    blocks: np.ndarray  # (T,) physical block
    layers_written: list[int]  # layer indices, in the order they wrote
    bytes_per_layer: int  # K and V bytes written per layer
    key_norms: np.ndarray  # (L, T, KVH) L2 norm of each written key vector
    value_norms: np.ndarray  # (L, T, KVH)


@dataclass
class CapturedQK:
    """Post-RoPE queries, keys and values of one request, every layer: what attention saw
    and what was written to the KV cache, for rebuilding attention maps and comparing caches."""

    dtype: str  # what they are stored in
    positions: np.ndarray  # (N,) positions covered, in order
    scaling: list[float]  # (L,) the softmax scale each layer used
    queries: list[np.ndarray]  # L x (H, N, D)
    keys: list[np.ndarray]  # L x (KVH, N, D)
    values: list[np.ndarray] = field(default_factory=list)  # L x (KVH, N, D)


@dataclass
class ProfileRecord:
    """torch.profiler output: one row per op, and the Chrome trace (opens in Perfetto).

    The Chrome trace is kept in memory, gzip-compressed (``chrome_trace_json`` gives the
    JSON); ``chrome_trace_path`` names a file only when the caller asked for one.
    """

    op_table: list[dict]  # op, calls, self_time_s, total_time_s, device_time_s (self), device_total_s, flops
    chrome_trace_path: str
    activities: list[str]
    chrome_trace_gz: bytes = b""

    def chrome_trace_json(self) -> bytes:
        """The Chrome trace as JSON bytes (empty when the run kept none)."""
        return gzip.decompress(self.chrome_trace_gz) if self.chrome_trace_gz else b""


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
    capture_level: str = "none"
    layer_times: LayerTimes | None = None  # timing, inspect, profile
    kv_writes: KVWriteRecord | None = None  # inspect
    hidden_norms: np.ndarray | None = None  # inspect: (L + 1, T) norm after embedding and each layer
    dispatch: dict | None = None  # the measured dispatch's choice: {"bucket", "attention", "linears"}

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
    time_to_first_token_s: float | None  # arrival (after tokenizing) to first token sampled
    inter_token_times_s: list[float]
    first_token_top_ids: list[int] = field(default_factory=list)
    first_token_top_probs: list[float] = field(default_factory=list)
    first_token_entropy_nats: float | None = None
    first_token_text: str | None = None
    detokenize_time_s: float = 0.0
    first_token_logits: np.ndarray | None = None  # (V,) fp32, to re-sample without the model
    ttft_breakdown_s: dict[str, float] = field(default_factory=dict)

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
    capture_level: str = "none"  # of the last run; each step records its own
    captured_qk: dict[str, CapturedQK] = field(default_factory=dict)  # inspect
    profile: ProfileRecord | None = None

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def summary(self) -> dict:
        """JSON-ready scalars and lists (no arrays): what the CLI prints."""
        data = asdict(self)
        data.pop("captured_qk")
        for step, record in zip(data["steps"], self.steps):
            step["num_scheduled_tokens"] = record.num_scheduled_tokens
            step.pop("kv_writes")
            step.pop("hidden_norms")
        for request in data["requests"].values():
            request.pop("first_token_logits")
        return data
