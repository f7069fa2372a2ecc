"""The engine loop: ``add_request`` -> ``step`` ... -> ``Trace``.

One code path serves every view of the app:

    parallel prefill   one request, token_budget >= prompt length   (one step)
    token-by-token     one request, token_budget = 1                (N steps)
    chunked prefill    several requests, budget B, decodes first
    prefix-cache hit   num_computed_tokens starts after the cached blocks
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from prefillviz.config import EngineConfig
from prefillviz.devices import dtype_name
from prefillviz.engine.block_pool import BlockPool
from prefillviz.engine.kv_cache import PagedKVCache
from prefillviz.engine.request import Request, RequestStatus, SamplingParams
from prefillviz.engine.runner import ModelRunner
from prefillviz.engine.scheduler import Scheduler
from prefillviz.hosted import hosted_policy
from prefillviz.errors import OutOfMemory, RequestError, is_out_of_memory
from prefillviz.instrument.capture import capture
from prefillviz.instrument.trace import RequestRecord, StepRecord, Trace
from prefillviz.models import model_info


class LLMEngine:
    """A tiny vLLM-style serving engine around a stock transformers causal LM.

    Args:
        model: a loaded ``PreTrainedModel`` (eval mode, on its device and dtype).
        tokenizer: its tokenizer.
        config: scheduling and KV cache settings.
        model_id: a name for the trace.
    """

    def __init__(self, model, tokenizer, config: EngineConfig | None = None, model_id: str = "") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.model_id = model_id
        self.info = model_info(model)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.kv_bytes_per_token = self.info.kv_bytes_per_token  # the model's dtype is the cache's
        num_blocks = self.config.num_blocks or self.config.kv_cache_memory_bytes // (self.kv_bytes_per_token * self.config.block_size)
        if self.config.num_blocks is None and self.info.max_context:  # never more than the running requests can fill
            num_blocks = min(num_blocks, -(-self.info.max_context // self.config.block_size) * self.config.max_num_running)
        if num_blocks < 1:
            raise RequestError(
                f"The KV memory budget ({self.config.kv_cache_memory_bytes:,} bytes) is smaller than one block "
                f"({self.kv_bytes_per_token * self.config.block_size:,} bytes); raise kv_cache_memory_bytes."
            )
        self.kv_cache = PagedKVCache(
            self.info.num_layers, num_blocks, self.config.block_size, self.info.num_kv_heads, self.info.head_dim, self.dtype, self.device
        )
        self.block_pool = BlockPool(num_blocks, enable_caching=self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.block_pool)
        self.runner = ModelRunner(model, self.kv_cache, self.config.block_size, self.config.pack_linear_weights)
        self.steps: list[StepRecord] = []
        self.first_token_samples: dict = {}  # request id -> SampleResult of its first token
        self.first_token_logits: dict[str, torch.Tensor] = {}  # request id -> (V,) fp32 logits
        self.first_token_text: dict[str, tuple[str, float]] = {}  # request id -> (text, detokenize seconds)
        self.capture = None  # set by instrument.capture while a capture is installed
        self._start_time: float | None = None
        self._next_request_number = 0

    # ---------------------------------------------------------------- time
    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _since_start(self, t: float) -> float:
        return t - self._start_time if self._start_time is not None else 0.0

    # ---------------------------------------------------------------- requests
    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def requests(self) -> dict[str, Request]:
        return self.scheduler.requests

    def add_request(
        self,
        prompt: str | list[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> Request:
        """Tokenize (if text), check it can be served, and queue it.

        Raises:
            RequestError: empty prompt, longer than the model's context or the KV capacity,
                unknown token ids, or a duplicate request id.
        """
        params = sampling_params or SamplingParams()
        tokenize_start = time.perf_counter()
        if isinstance(prompt, str):
            if not prompt.strip():
                raise RequestError("The prompt is empty: type some text to run the model on.")
            token_ids = list(self.tokenizer(prompt)["input_ids"])
        else:
            token_ids = [int(t) for t in prompt]
        tokenize_time_s = time.perf_counter() - tokenize_start
        request_id = request_id or f"req-{self._next_request_number}"
        self._check_request(request_id, token_ids, params)
        self._next_request_number += 1
        request = Request(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            arrival_time=self._now(),
            tokenize_time_s=tokenize_time_s,
        )
        if params.seed is not None:
            request.generator = torch.Generator().manual_seed(params.seed)
        self.scheduler.add_request(request)
        return request

    def _check_request(self, request_id: str, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise RequestError("The prompt is empty: it has no tokens.")
        if request_id in self.scheduler.requests:
            raise RequestError(f"A request named {request_id!r} already exists.")
        if params.max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be at least 1, got {params.max_new_tokens}.")
        if params.temperature < 0 or not 0 < params.top_p <= 1 or params.top_k < 0:
            raise RequestError("Sampling needs temperature >= 0, 0 < top_p <= 1 and top_k >= 0.")
        if min(token_ids) < 0 or max(token_ids) >= self.info.vocab_size:
            raise RequestError(f"Token ids must lie in 0..{self.info.vocab_size - 1}.")
        policy = hosted_policy()
        if policy.enabled and (len(token_ids) > policy.max_prompt_tokens or params.max_new_tokens > policy.max_new_tokens):
            raise RequestError(
                f"This hosted demo serves prompts of up to {policy.max_prompt_tokens:,} tokens and "
                f"{policy.max_new_tokens} new tokens; this one has {len(token_ids):,} and asks for {params.max_new_tokens}."
            )
        total = len(token_ids) + params.max_new_tokens
        if self.info.max_context and total > self.info.max_context:
            raise RequestError(
                f"The prompt has {len(token_ids):,} tokens; with {params.max_new_tokens} new token(s) that is "
                f"{total:,}, more than this model's context of {self.info.max_context:,} tokens. Shorten the prompt."
            )
        capacity = self.num_blocks * self.config.block_size
        if total > capacity:
            raise RequestError(
                f"The prompt needs {total:,} token slots but the KV cache holds {capacity:,} "
                f"({self.num_blocks} blocks of {self.config.block_size}). Shorten the prompt or raise the KV memory budget."
            )

    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its blocks."""
        request = self.scheduler.requests[request_id]
        if not request.is_finished:
            self.scheduler.finish_request(request, RequestStatus.FINISHED_ABORTED, self._now())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---------------------------------------------------------------- steps
    def step(self) -> StepRecord:
        """Schedule, run the model once over every scheduled token, sample, advance.

        Returns:
            The ``StepRecord`` of this step (also appended to ``self.steps``).

        Raises:
            OutOfMemory, RequestError: the step could not run (out of memory, a stalled queue). The
                requests scheduled in it are aborted and their blocks freed, so the engine
                stays usable.
        """
        t_start = self._now()
        if self._start_time is None:
            self._start_time = t_start
        output = self.scheduler.schedule(now=t_start)
        if not output.chunks:
            self._abort_all_waiting()
            raise RequestError("No request could be scheduled: the KV cache is too small for what is waiting.")
        t_scheduled = time.perf_counter()
        requests = self.scheduler.requests
        try:
            inputs = self.runner.prepare(output, requests)
            t_prepared = self._now()
            logits = self.runner.forward(inputs)
            t_forward = self._now()
            runner_output = self.runner.sample(output, requests, logits)
        except Exception as error:  # free the step's requests, keep the engine usable
            now = self._now()
            for chunk in output.chunks:
                self.scheduler.finish_request(requests[chunk.request_id], RequestStatus.FINISHED_ABORTED, now)
            if is_out_of_memory(error):
                raise OutOfMemory(
                    f"Out of memory while running {output.total_num_scheduled_tokens:,} tokens in one step. "
                    "Try a shorter prompt, a smaller token budget, or a smaller model."
                ) from error
            raise
        t_sampled = time.perf_counter()
        sampled = {request_id: result.token_id for request_id, result in runner_output.samples.items()}
        for request_id, row in runner_output.first_token_logits.items():
            self.first_token_logits[request_id] = row
            self.first_token_samples[request_id] = runner_output.samples[request_id]
        self.scheduler.update(output, sampled, now=t_sampled)
        t_end = time.perf_counter()
        if self.tokenizer is not None:  # detokenize first tokens: the text a user waits for
            for request_id in runner_output.first_token_logits:
                t_detokenize = time.perf_counter()
                text = self.tokenizer.decode([sampled[request_id]])
                self.first_token_text[request_id] = (text, time.perf_counter() - t_detokenize)
        record = StepRecord(
            step_index=len(self.steps),
            chunks=output.chunks,
            blocks_hit=output.blocks_hit,
            blocks_allocated=output.blocks_allocated,
            blocks_evicted=output.blocks_evicted,
            preempted_request_ids=output.preempted_request_ids,
            sampled_token_ids=sampled,
            num_free_blocks=self.block_pool.num_free_blocks,
            start_time_s=self._since_start(t_start),
            wall_time_s=t_end - t_start,
            schedule_time_s=t_scheduled - t_start,
            prepare_time_s=t_prepared - t_scheduled,
            forward_time_s=t_forward - t_prepared,
            sample_time_s=t_sampled - t_forward,
            update_time_s=t_end - t_sampled,
        )
        if self.capture is not None:
            self.capture.end_step(record)
        self.steps.append(record)
        return record

    def _abort_all_waiting(self) -> None:
        now = self._now()
        for request in list(self.scheduler.waiting):
            self.scheduler.finish_request(request, RequestStatus.FINISHED_ABORTED, now)

    def run(
        self,
        max_steps: int | None = None,
        progress: Callable[[int, StepRecord], None] | None = None,
        capture_level: str = "none",
        profile_dir: str | None = None,
    ) -> Trace:
        """Step until every request has finished (or ``max_steps``); return the trace.

        Args:
            max_steps: stop after this many steps of this call.
            progress: called after each step with (steps done in this call, the step record).
            capture_level: "none", "timing", "inspect" or "profile" (see ``instrument.capture``).
            profile_dir: where the profile level also writes its Chrome trace as a file (it is
                kept in memory either way: ``trace.profile.chrome_trace_json()``).
        """
        num_steps = 0
        with capture(self, capture_level, profile_dir) as recorder:
            while self.has_unfinished_requests() and (max_steps is None or num_steps < max_steps):
                record = self.step()
                num_steps += 1
                if progress is not None:
                    progress(num_steps, record)
        trace = self.trace()
        recorder.attach(trace)
        return trace

    # ---------------------------------------------------------------- results
    def _ttft_breakdown(self, request: Request) -> dict[str, float]:
        """Where the time to the first token went: tokenize, then every step from arrival to it."""
        if request.first_token_time is None:
            return {}
        parts = {"tokenize_s": request.tokenize_time_s, "schedule_s": 0.0, "forward_s": 0.0, "sample_s": 0.0}
        arrival, first = self._since_start(request.arrival_time), self._since_start(request.first_token_time)
        for step in self.steps:
            if step.start_time_s + 1e-9 >= arrival and step.start_time_s <= first:
                parts["schedule_s"] += step.schedule_time_s + step.prepare_time_s
                parts["forward_s"] += step.forward_time_s
                parts["sample_s"] += step.sample_time_s
        parts["detokenize_s"] = self.first_token_text.get(request.request_id, ("", 0.0))[1]
        engine_ttft = request.time_to_first_token_s
        parts["other_s"] = max(0.0, engine_ttft - parts["schedule_s"] - parts["forward_s"] - parts["sample_s"])
        parts["total_s"] = parts["tokenize_s"] + engine_ttft + parts["detokenize_s"]
        return parts

    def _request_record(self, request: Request) -> RequestRecord:
        first = self.first_token_samples.get(request.request_id)
        logits = self.first_token_logits.get(request.request_id)
        text, detokenize_s = self.first_token_text.get(request.request_id, (None, 0.0))
        return RequestRecord(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            output_token_ids=list(request.output_token_ids),
            status=request.status.value,
            num_cached_tokens=request.num_cached_tokens,
            num_preemptions=request.num_preemptions,
            arrival_time_s=self._since_start(request.arrival_time),
            tokenize_time_s=request.tokenize_time_s,
            time_to_first_token_s=request.time_to_first_token_s,
            inter_token_times_s=request.inter_token_times_s,
            first_token_top_ids=first.top_token_ids if first else [],
            first_token_top_probs=first.top_probs if first else [],
            first_token_entropy_nats=first.entropy_nats if first else None,
            first_token_text=text,
            detokenize_time_s=detokenize_s,
            first_token_logits=logits.numpy() if logits is not None else None,
            ttft_breakdown_s=self._ttft_breakdown(request),
        )

    def trace(self) -> Trace:
        return Trace(
            model_id=self.model_id,
            device=str(self.device),
            dtype=dtype_name(self.dtype),
            engine_config=self.config.as_dict(),
            num_blocks=self.num_blocks,
            kv_cache_bytes=self.kv_cache.num_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            steps=list(self.steps),
            requests={rid: self._request_record(r) for rid, r in self.scheduler.requests.items()},
            prefix_cache_queries=self.scheduler.prefix_cache_queries,
            prefix_cache_hits=self.scheduler.prefix_cache_hits,
        )
