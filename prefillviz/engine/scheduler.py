"""The token-budget scheduler (vLLM v1 style: no prefill or decode phase).

Each request has ``num_tokens`` (prompt + outputs) and ``num_computed_tokens`` (K/V in
cache). A step hands out at most ``token_budget`` tokens:

1. Running requests, those decoding first: each gets what it still lacks (1 token for a decode,
   the rest of the prompt for a partly prefilled one), cut to the budget left. Short of blocks,
   the last running request in line is preempted: its blocks freed, recomputed later from the start.
2. Waiting requests, first come first served, while budget and blocks last. Prefix caching
   first looks up the prompt's full blocks; hits start ``num_computed_tokens`` at the end
   of the hit blocks, so those tokens are never run again.

Chunked prefill is nothing more than step 2 cutting a prompt to the budget left after the
decodes. With chunking off the scheduler behaves like the old prefill-first engines: a step
that admits waiting prompts runs them whole and nothing else, pausing every decode.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from prefillviz.engine.block_pool import BlockPool
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.request import Request, RequestStatus


@dataclass
class ScheduledChunk:
    """The tokens one request runs in one step: positions [start_position, start_position + num_tokens)."""

    request_id: str
    start_position: int
    num_tokens: int
    is_prefill: bool  # the chunk starts inside the prompt
    will_sample: bool  # after it, every known token is computed, so a new token is sampled


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)  # packing order of the batch
    blocks_hit: dict[str, list[int]] = field(default_factory=dict)
    blocks_allocated: dict[str, list[int]] = field(default_factory=dict)
    blocks_evicted: list[int] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {chunk.request_id: chunk.num_tokens for chunk in self.chunks}


class Scheduler:
    def __init__(self, config: EngineConfig, block_pool: BlockPool) -> None:
        self.config = config
        self.block_pool = block_pool
        self.block_size = config.block_size
        self.requests: dict[str, Request] = {}  # unfinished only (the engine keeps a finished one's record)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # vLLM's prefix-cache counters, in tokens
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # ---------------------------------------------------------------- bookkeeping
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def add_running_request(self, request: Request) -> None:
        """A request that arrives with its prompt computed elsewhere (``LLMEngine.add_prefilled_request``):
        it joins the running set at once; ``update`` hashes its full blocks after its first step, as for any request."""
        self.requests[request.request_id] = request
        self.running.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def finish_request(self, request: Request, status: RequestStatus, now: float) -> None:
        """Mark finished, free the blocks (tail first, so they are evicted first) and let the request go."""
        self.requests.pop(request.request_id, None)
        self.block_pool.free(list(reversed(request.block_table)))
        request.block_table = []
        request.status = status
        request.finished_time = now
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)

    def _num_new_blocks(self, request: Request, num_new_tokens: int) -> int:
        num_needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, num_needed - len(request.block_table))

    def _preempt(self, request: Request, output: SchedulerOutput) -> None:
        self.block_pool.free(list(reversed(request.block_table)))
        request.block_table = []
        request.block_hashes = []
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.running.remove(request)
        self.waiting.appendleft(request)
        output.preempted_request_ids.append(request.request_id)

    def _schedule_chunk(self, request: Request, num_tokens: int, output: SchedulerOutput, now: float) -> None:
        new_blocks = self.block_pool.allocate(self._num_new_blocks(request, num_tokens))
        request.block_table.extend(new_blocks)
        if new_blocks:
            output.blocks_allocated[request.request_id] = new_blocks
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
        start = request.num_computed_tokens
        output.chunks.append(ScheduledChunk(request.request_id, start, num_tokens, is_prefill=request.is_prefilling,
                                            will_sample=start + num_tokens == request.num_tokens))

    def _find_cached_blocks(self, request: Request) -> list[int]:
        """Leading full blocks of the request already in the cache (never the last token's block)."""
        hits: list[int] = []
        parent_hash = None
        token_ids = request.all_token_ids
        max_hit_blocks = (request.num_tokens - 1) // self.block_size  # keep >= 1 token to compute
        for i in range(max_hit_blocks):
            block_tokens = token_ids[i * self.block_size : (i + 1) * self.block_size]
            block_id = self.block_pool.lookup(parent_hash, block_tokens)
            if block_id is None:
                break
            hits.append(block_id)
            parent_hash = self.block_pool.blocks[block_id].block_hash
        return hits

    # ---------------------------------------------------------------- schedule
    def schedule(self, now: float = 0.0) -> SchedulerOutput:
        """Decide which tokens of which requests run in the next step (``chunks`` in batch order)."""
        output = SchedulerOutput()
        budget = self.config.token_budget
        if not self.config.enable_chunked_prefill:
            self._admit_waiting_whole(output, now)
            if output.chunks:  # a prefill-first step: decodes wait
                output.blocks_evicted = self.block_pool.drain_evicted()
                return output

        # 1. running requests, decoding ones first
        queue = sorted(self.running, key=lambda r: r.is_prefilling)
        i = 0
        while i < len(queue) and budget > 0:
            request = queue[i]
            num_tokens = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self.block_pool.can_allocate(self._num_new_blocks(request, num_tokens)):
                victim = queue.pop()  # lowest priority: last in line
                self._preempt(victim, output)
                if victim is request:
                    break
            if request.status is RequestStatus.PREEMPTED:
                break
            self._schedule_chunk(request, num_tokens, output, now)
            budget -= num_tokens
            i += 1

        # 2. waiting requests, unless this step had to preempt
        if self.config.enable_chunked_prefill and not output.preempted_request_ids:
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_running:
                request = self.waiting[0]
                num_tokens = self._admit(request, budget, output, now)
                if num_tokens == 0:
                    break
                budget -= num_tokens
        output.blocks_evicted = self.block_pool.drain_evicted()
        return output

    def _admit_waiting_whole(self, output: SchedulerOutput, now: float) -> None:
        """Chunking off: admit whole prompts; the first always fits, later ones share the budget."""
        budget = self.config.token_budget
        while self.waiting and len(self.running) < self.config.max_num_running:
            request = self.waiting[0]
            remaining = budget if output.chunks else None  # None: no limit for the first
            if self._admit(request, remaining, output, now, whole=True) == 0:
                break
            budget -= output.chunks[-1].num_tokens

    def _admit(self, request: Request, budget: int | None, output: SchedulerOutput, now: float, whole=False) -> int:
        """Move ``request`` from waiting to running with up to ``budget`` tokens; 0 if it can't."""
        hits = self._find_cached_blocks(request) if request.num_computed_tokens == 0 else []
        num_computed = len(hits) * self.block_size
        num_tokens = request.num_tokens - num_computed
        if budget is not None:
            if whole and num_tokens > budget:
                return 0
            num_tokens = min(num_tokens, budget)
        num_new_blocks = -(-(num_computed + num_tokens) // self.block_size) - len(hits)
        num_hits_in_free_queue = sum(self.block_pool.blocks[b].ref_cnt == 0 for b in hits)
        if not self.block_pool.can_allocate(num_new_blocks + num_hits_in_free_queue):
            return 0
        self.block_pool.touch(hits)
        request.block_table = list(hits)
        request.block_hashes = [self.block_pool.blocks[b].block_hash for b in hits]
        request.num_computed_tokens = num_computed
        if request.num_preemptions == 0:
            request.num_cached_tokens = num_computed
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_computed
        if hits:
            output.blocks_hit[request.request_id] = list(hits)
        self.waiting.popleft()
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        self._schedule_chunk(request, num_tokens, output, now)
        return num_tokens

    # ---------------------------------------------------------------- update
    def update(self, output: SchedulerOutput, sampled_token_ids: dict[str, int], now: float) -> list[Request]:
        """Advance every request of ``output`` after the model ran, with the token sampled for each chunk that
        had ``will_sample``, at ``now`` (device-synchronized). Returns the requests that finished (blocks freed)."""
        finished = []
        for chunk in output.chunks:
            request = self.requests[chunk.request_id]
            request.num_computed_tokens += chunk.num_tokens
            self._cache_full_blocks(request)
            token_id = sampled_token_ids.get(chunk.request_id)
            if token_id is None:
                continue
            request.output_token_ids.append(token_id)
            if request.first_token_time is None:
                request.first_token_time = now
            request.token_times.append(now)
            params = request.sampling_params
            if token_id in params.stop_token_ids:
                self.finish_request(request, RequestStatus.FINISHED_STOPPED, now)
            elif len(request.output_token_ids) >= params.max_new_tokens:
                self.finish_request(request, RequestStatus.FINISHED_LENGTH, now)
            if request.is_finished:
                finished.append(request)
        return finished

    def _cache_full_blocks(self, request: Request) -> None:
        token_ids = request.all_token_ids
        num_full_blocks = request.num_computed_tokens // self.block_size
        for i in range(len(request.block_hashes), num_full_blocks):
            parent_hash = request.block_hashes[-1] if request.block_hashes else None
            block_tokens = token_ids[i * self.block_size : (i + 1) * self.block_size]
            request.block_hashes.append(
                self.block_pool.cache_full_block(request.block_table[i], parent_hash, block_tokens)
            )
