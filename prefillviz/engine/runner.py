"""Runs one scheduled step through the model: pack, forward, sample.

Every scheduled token of every request goes into one (1, T) batch:

    batch row:    0    1    2    3 |  4 |  5       T = 6
    request:      A    A    A    A |  B |  C       A: prefill chunk, B and C: decodes
    position:     32   33   34   35|  17|  9       (each request's own positions)
    slot:         block_table[p // block_size] * block_size + p % block_size

Which attention and linears a step runs is the measured dispatch's choice for the step's
bucket (``dispatch.py``); on a CPU the linears it picks may run with weights packed once
(``packed_weights.py``).
Logits are computed only at the last row of each request that samples (``logits_to_keep``
as an index tensor), so a prefill never pays for the lm_head over the whole prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefillviz.engine import dispatch_tables
from prefillviz.engine.attention import AttentionMetadata, engine_attention
from prefillviz.engine.kv_cache import PagedKVCache
from prefillviz.engine.llama_forward import LlamaForward
from prefillviz.engine.packed_weights import packed_linears
from prefillviz.engine.request import Request, SampleResult
from prefillviz.engine.sampler import sample
from prefillviz.engine.scheduler import SchedulerOutput


@dataclass
class RunnerOutput:
    samples: dict[str, SampleResult]  # per request that sampled
    first_token_logits: dict[str, torch.Tensor]  # (V,) fp32 on CPU, for requests sampling their first token


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: PagedKVCache, block_size: int, pack_linear_weights: bool = True) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.pack_linear_weights = pack_linear_weights
        self.device = next(model.parameters()).device
        self.observers: list = []  # attention observers added by instruments
        self.own_forward = LlamaForward(model)  # the engine's forward; the stock one under instruments' hooks
        self.span_clock = None  # a timing or inspection pass's SpanClock, while instrument.capture runs one on the engine's forward
        self.hidden_observer = None  # an inspection pass's (i, hidden (T, hidden)) callback, likewise
        self.last_choice: dispatch_tables.StepChoice | None = None  # what the last step ran (the step record keeps it)
        dispatch_tables.table_for(model)  # measured now (once per machine, model shape and dtype), not inside a timed step

    def _slots(self, request: Request, start: int, end: int) -> torch.Tensor:
        positions = torch.arange(start, end)
        table = torch.tensor(request.block_table, dtype=torch.long)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def prepare(self, output: SchedulerOutput, requests: dict[str, Request]) -> dict:
        """Build the model inputs and attention metadata for one step.

        Returns:
            The model's keyword arguments; logits are kept at the last row of each sampling
            request, in chunk order.
        """
        input_ids, positions, slots, context_slots, query_start_loc, num_computed = [], [], [], [], [0], []
        sample_rows = []
        for chunk in output.chunks:
            request = requests[chunk.request_id]
            start, end = chunk.start_position, chunk.start_position + chunk.num_tokens
            input_ids.extend(request.all_token_ids[start:end])
            positions.append(torch.arange(start, end))
            slots.append(self._slots(request, start, end))
            context_slots.append(self._slots(request, 0, end).to(self.device) if start > 0 else None)
            num_computed.append(start)
            query_start_loc.append(query_start_loc[-1] + chunk.num_tokens)
            if chunk.will_sample:
                sample_rows.append(query_start_loc[-1] - 1)
        position_ids = torch.cat(positions)
        metadata = AttentionMetadata(
            kv_cache=self.kv_cache,
            slot_mapping=torch.cat(slots).to(self.device),
            query_start_loc=query_start_loc,
            num_computed_tokens=num_computed,
            context_slots=context_slots,
            observers=self.observers,
            request_ids=[chunk.request_id for chunk in output.chunks],
            positions=position_ids,
        )
        inputs = dict(
            input_ids=torch.tensor([input_ids], dtype=torch.long, device=self.device),
            position_ids=position_ids.unsqueeze(0).to(self.device),
            use_cache=False,
            logits_to_keep=torch.tensor(sample_rows or [query_start_loc[-1] - 1], dtype=torch.long, device=self.device),
            prefillviz_metadata=metadata,
        )
        return inputs

    @torch.inference_mode()
    def forward(self, inputs: dict) -> torch.Tensor:
        """One model call over the packed batch; returns logits (num_kept, V) in fp32 on CPU."""
        meta = inputs["prefillviz_metadata"]
        choice = meta.choice = self.last_choice = dispatch_tables.choose(self.model, meta.paged_step, self.pack_linear_weights)
        if self.own_forward.usable():
            return self.own_forward(inputs, choice, self.span_clock, self.hidden_observer).float().cpu()
        with engine_attention(self.model), packed_linears(self.model, choice.linears != "stock", choice.linears):
            logits = self.model(**inputs).logits[0]
        return logits.float().cpu()

    def sample(self, output: SchedulerOutput, requests: dict[str, Request], logits: torch.Tensor) -> RunnerOutput:
        samples, first_token_logits = {}, {}
        sampling_chunks = [chunk for chunk in output.chunks if chunk.will_sample]
        for row, chunk in zip(logits, sampling_chunks):
            request = requests[chunk.request_id]
            samples[chunk.request_id] = sample(row, request.sampling_params, request.generator)
            if not request.output_token_ids:
                first_token_logits[chunk.request_id] = row
        return RunnerOutput(samples=samples, first_token_logits=first_token_logits)
