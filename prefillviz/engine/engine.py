"""The engine loop: ``add_request`` -> ``step`` ... -> ``Trace``.

One code path serves every view of the app:

    parallel prefill   one request, token_budget >= prompt length   (one step)
    token-by-token     one request, token_budget = 1                (N steps)
    chunked prefill    several requests, budget B, decodes first
    prefix-cache hit   num_computed_tokens starts after the cached blocks

A finished request leaves the scheduler; the engine keeps its ``RequestRecord``, made once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

import torch

from prefillviz.engine.backend import Backend, backend_for
from prefillviz.engine.block_pool import BlockPool
from prefillviz.engine.clock import synchronized_time
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.errors import OutOfMemory, RequestError, is_out_of_memory
from prefillviz.engine.kv_cache import PagedKVCache, cache_shape, kv_bytes_per_token
from prefillviz.engine.observer import RunObserver
from prefillviz.engine.request import Request, RequestStatus, SamplingParams
from prefillviz.engine.request_checks import check_prompt_text, check_request
from prefillviz.engine.runner import ModelRunner, RunnerOutput
from prefillviz.engine.scheduler import Scheduler, SchedulerOutput
from prefillviz.engine.trace import RequestRecord, StepRecord, Trace, request_record, since


class LLMEngine:
    """A tiny vLLM-style serving engine around a loaded transformers causal LM (eval mode, on its device
    and dtype) and its tokenizer; ``backend``: the ops its steps run (None: ``backend_for(model)``)."""

    def __init__(
        self, model, tokenizer, config: EngineConfig | None = None, model_id: str = "", backend: Backend | None = None
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.model_id = model_id
        self.backend = backend or backend_for(model)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.num_layers, self.num_kv_heads, self.head_dim = cache_shape(model.config)
        text_config = model.config.get_text_config()
        self.max_context = getattr(text_config, "max_position_embeddings", None)
        self.vocab_size = text_config.vocab_size
        kv_heads = self.num_kv_heads  # the cache has the model's dtype
        self.kv_bytes_per_token = kv_bytes_per_token(self.num_layers, kv_heads, self.head_dim, self.dtype.itemsize)
        num_blocks = self.config.kv_blocks(self.kv_bytes_per_token, self.max_context)
        if num_blocks < 1:
            raise RequestError(
                f"The KV memory budget ({self.config.kv_cache_memory_bytes:,} bytes) is smaller than one block "
                f"({self.kv_bytes_per_token * self.config.block_size:,} bytes); raise kv_cache_memory_bytes."
            )
        self.kv_cache = PagedKVCache(self.num_layers, num_blocks, self.config.block_size, kv_heads, self.head_dim,
                                     self.dtype, self.device, self.backend.new_kv_cache)
        self.block_pool = BlockPool(num_blocks, enable_caching=self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.block_pool)
        self.runner = ModelRunner(model, self.kv_cache, self.config.block_size, self.backend)
        self.steps: list[StepRecord] = []
        self.request_records: dict[str, RequestRecord | None] = {}  # arrival order; None until it finishes
        self.observer: RunObserver | None = None  # what watches the run in progress (``run``'s observer)
        self._start_time: float | None = None
        self._next_request_number = 0

    # ---------------------------------------------------------------- requests
    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None) -> Request:
        """Tokenize (if text), check it can be served (else ``RequestError``, ``request_checks.py``), and queue it."""
        params = sampling_params or SamplingParams()
        tokenize_start = time.perf_counter()
        if isinstance(prompt, str):
            check_prompt_text(prompt)
            token_ids = list(self.tokenizer(prompt)["input_ids"])
        else:
            token_ids = [int(t) for t in prompt]
        tokenize_time_s = time.perf_counter() - tokenize_start
        request_id = request_id or f"req-{self._next_request_number}"
        self._check_request(request_id, token_ids, params)
        self._next_request_number += 1
        self.request_records[request_id] = None
        request = Request(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            arrival_time=synchronized_time(self.device),
            tokenize_time_s=tokenize_time_s,
        )
        if params.seed is not None:
            request.generator = torch.Generator().manual_seed(params.seed)
        self.scheduler.add_request(request)
        return request

    def add_prefilled_request(
        self, prompt_token_ids: list[int], first_token_id: int, sampling_params: SamplingParams, request_id: str,
        arrival_time: float, first_token_time: float,
    ) -> Request:
        """Admit a request whose prompt another engine prefilled (disaggregated serving), running, its first
        token sampled; the caller writes the prompt's K/V through ``request.block_table`` before the next step."""
        token_ids = [int(t) for t in prompt_token_ids]
        self._check_request(request_id, token_ids, sampling_params)
        num_prompt_blocks = -(-len(token_ids) // self.config.block_size)
        if not self.block_pool.can_allocate(num_prompt_blocks):
            raise RequestError(f"No room for {request_id!r}: its {len(token_ids):,}-token prompt needs "
                               f"{num_prompt_blocks} free KV blocks.")
        blocks = self.block_pool.allocate(num_prompt_blocks)
        request = Request.prefilled(request_id, token_ids, sampling_params, int(first_token_id), blocks, arrival_time,
                                    first_token_time)
        self.request_records[request_id] = None
        self.scheduler.add_running_request(request)
        return request

    @property
    def start_time(self) -> float | None:
        """When the first step started (host ``perf_counter`` seconds); step times count from it."""
        return self._start_time

    def _check_request(self, request_id: str, token_ids: list[int], params: SamplingParams) -> None:
        check_request(request_id, token_ids, params, self.config, self.vocab_size, self.max_context, self.num_blocks,
                      self.request_records)

    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its blocks (a no-op once it has finished)."""
        if request_id not in self.request_records:
            raise KeyError(request_id)
        if request_id in self.scheduler.requests:
            self._abort([self.scheduler.requests[request_id]])

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---------------------------------------------------------------- steps
    def step(self) -> StepRecord:
        """Schedule, run the model once over every scheduled token, sample, advance; returns the step's record.

        On ``OutOfMemory`` or ``RequestError`` (a stalled queue) the step's requests are aborted and their
        blocks freed, so the engine stays usable.
        """
        clock = {"start": synchronized_time(self.device)}  # when each phase ended (host seconds)
        if self._start_time is None:
            self._start_time = clock["start"]
        output = self.scheduler.schedule(now=clock["start"])
        if not output.chunks:
            self._abort(list(self.scheduler.waiting))
            raise RequestError("No request could be scheduled: the KV cache is too small for what is waiting.")
        clock["schedule"] = time.perf_counter()
        requests = {chunk.request_id: self.scheduler.requests[chunk.request_id] for chunk in output.chunks}
        runner_output = self._execute(output, requests, clock)
        clock["sample"] = time.perf_counter()
        sampled = {request_id: result.token_id for request_id, result in runner_output.samples.items()}
        finished = self.scheduler.update(output, sampled, now=clock["sample"])
        clock["update"] = time.perf_counter()
        self._keep_first_tokens(runner_output, requests)
        record = self._step_record(output, sampled, clock)
        if self.observer is not None:
            self.observer.end_step(record)
        self.steps.append(record)
        self._keep_records(finished)  # after the step is in self.steps: a TTFT breakdown counts it
        return record

    def _execute(self, output: SchedulerOutput, requests: dict[str, Request], clock: dict[str, float]) -> RunnerOutput:
        """Prepare, forward and sample (timing the first two); on failure abort the step's requests."""
        try:
            inputs = self.runner.prepare(output, requests)
            clock["prepare"] = synchronized_time(self.device)
            logits = self.runner.forward(inputs, self.observer)
            clock["forward"] = synchronized_time(self.device)
            return self.runner.sample(output, requests, logits)
        except Exception as error:  # free the step's requests, keep the engine usable
            self._abort(list(requests.values()))
            if is_out_of_memory(error):
                raise OutOfMemory(
                    f"Out of memory while running {output.total_num_scheduled_tokens:,} tokens in one step. "
                    "Try a shorter prompt, a smaller token budget, or a smaller model."
                ) from error
            raise

    def _keep_first_tokens(self, runner_output: RunnerOutput, requests: dict[str, Request]) -> None:
        """Put each first token's distribution, logits and text on its request (the text: what a user waits for)."""
        for request_id, logits in runner_output.first_token_logits.items():
            request = requests[request_id]
            request.first_token_sample, request.first_token_logits = runner_output.samples[request_id], logits
            if self.tokenizer is not None:
                detokenize_start = time.perf_counter()
                request.first_token_text = self.tokenizer.decode([request.first_token_sample.token_id])
                request.detokenize_time_s = time.perf_counter() - detokenize_start

    def _step_record(self, output: SchedulerOutput, sampled: dict[str, int], clock: dict[str, float]) -> StepRecord:
        return StepRecord(
            step_index=len(self.steps),
            chunks=output.chunks,
            blocks_hit=output.blocks_hit,
            blocks_allocated=output.blocks_allocated,
            blocks_evicted=output.blocks_evicted,
            preempted_request_ids=output.preempted_request_ids,
            sampled_token_ids=sampled,
            num_free_blocks=self.block_pool.num_free_blocks,
            start_time_s=since(self._start_time, clock["start"]),
            wall_time_s=clock["update"] - clock["start"],
            schedule_time_s=clock["schedule"] - clock["start"],
            prepare_time_s=clock["prepare"] - clock["schedule"],
            forward_time_s=clock["forward"] - clock["prepare"],
            sample_time_s=clock["sample"] - clock["forward"],
            update_time_s=clock["update"] - clock["sample"],
            ran=self.runner.last_ran,
        )

    def _abort(self, requests: list[Request]) -> None:
        now = synchronized_time(self.device)
        for request in requests:
            self.scheduler.finish_request(request, RequestStatus.FINISHED_ABORTED, now)
        self._keep_records(requests)

    def _keep_records(self, finished: list[Request]) -> None:
        """The trace's record of each finished request, made once: the scheduler has let it go."""
        for request in finished:
            self.request_records[request.request_id] = request_record(request, self.steps, self._start_time)

    def run(
        self,
        max_steps: int | None = None,
        progress: Callable[[int, StepRecord], None] | None = None,
        observer: RunObserver | None = None,
    ) -> Trace:
        """Step until every request has finished (or ``max_steps`` of this call); return the trace.

        ``progress(steps done in this call, the step record)`` after each step; ``observer`` (``observer.py``) is
        installed for the run, told of every step and handed the trace at the end.
        """
        num_steps = 0
        with observer.installed() if observer is not None else nullcontext():
            self.observer = observer
            try:
                while self.has_unfinished_requests() and (max_steps is None or num_steps < max_steps):
                    record = self.step()
                    num_steps += 1
                    if progress is not None:
                        progress(num_steps, record)
            finally:
                self.observer = None
        trace = self.trace()
        if observer is not None:
            observer.attach(trace)
        return trace

    # ---------------------------------------------------------------- results
    def trace(self) -> Trace:
        return Trace(
            model_id=self.model_id,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            engine_config=self.config.as_dict(),
            num_blocks=self.num_blocks,
            kv_cache_bytes=self.kv_cache.num_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            steps=list(self.steps),
            requests={rid: record or request_record(self.scheduler.requests[rid], self.steps, self._start_time)
                      for rid, record in self.request_records.items()},
            prefix_cache_queries=self.scheduler.prefix_cache_queries,
            prefix_cache_hits=self.scheduler.prefix_cache_hits,
        )
