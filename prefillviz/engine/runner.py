"""Runs one scheduled step through the model: pack, forward, sample.

Every scheduled token of every request goes into one (1, T) batch:

    batch row:    0    1    2    3 |  4 |  5       T = 6
    request:      A    A    A    A |  B |  C       A: prefill chunk, B and C: decodes
    position:     32   33   34   35|  17|  9       (each request's own positions)
    slot:         block_table[p // block_size] * block_size + p % block_size

The engine's backend (``backend.py``) gives the ops that compute the step. Logits are computed
only at the last row of each request that samples (``logits_to_keep`` as an index tensor), so a
prefill never pays for the lm_head over the whole prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefillviz.engine.attention import AttentionMetadata
from prefillviz.engine.backend import Backend
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.forward import LlamaForward, own_forward_status
from prefillviz.engine.kv_cache import PagedKVCache
from prefillviz.engine.request import Request, SampleResult
from prefillviz.engine.sampler import sample
from prefillviz.engine.scheduler import SchedulerOutput


@dataclass
class RunnerOutput:
    samples: dict[str, SampleResult]  # per request that sampled
    first_token_logits: dict[str, torch.Tensor]  # (V,) fp32 on CPU, for requests sampling their first token


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: PagedKVCache, block_size: int, backend: Backend) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.backend = backend
        self.device = next(model.parameters()).device
        known, self.why_stock_forward = own_forward_status(model)
        self.own_forward = LlamaForward(model) if known else None  # None: the backend's stock forward
        if not known and not hasattr(backend, "stock_forward"):
            raise ConfigError(f"The {backend.name} backend runs the engine's own forward only, which does not run "
                              f"this model ({self.why_stock_forward}); pick the measured backend.")
        self.last_ran: dict[str, str] | None = None  # what the last step ran (its record keeps it)
        backend.prepare(model)  # now, not in a timed step (the measured backend times its candidates here, once)

    def _slots(self, request: Request, start: int, end: int) -> torch.Tensor:
        positions = torch.arange(start, end)
        table = torch.tensor(request.block_table, dtype=torch.long)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def prepare(self, output: SchedulerOutput, requests: dict[str, Request]) -> dict:
        """The model's inputs and attention metadata for one step; logits are kept at the last row of each
        sampling request, in chunk order."""
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
            request_ids=[chunk.request_id for chunk in output.chunks],
            positions=position_ids,
        )
        return dict(
            input_ids=torch.tensor([input_ids], dtype=torch.long, device=self.device),
            position_ids=position_ids.unsqueeze(0).to(self.device),
            use_cache=False,
            logits_to_keep=torch.tensor(sample_rows or [query_start_loc[-1] - 1], dtype=torch.long, device=self.device),
            prefillviz_metadata=metadata,
        )

    @torch.inference_mode()
    def forward(self, inputs: dict, observer=None) -> torch.Tensor:
        """One model call over the packed batch; returns logits (num_kept, V) in fp32 on CPU."""
        meta = inputs["prefillviz_metadata"]
        ops = self.backend.for_step(self.model, meta)
        if self.own_forward is not None:
            self.last_ran = dict(ops.ran)  # a record of its own: a backend may share one dict between steps
            return self.own_forward(inputs, ops, observer).float().cpu()
        self.last_ran = {**ops.ran, "linears": "the model's own modules (stock forward)"}
        return self.backend.stock_forward(self.model, inputs, ops, observer).float().cpu()

    def sample(self, output: SchedulerOutput, requests: dict[str, Request], logits: torch.Tensor) -> RunnerOutput:
        samples, first_token_logits = {}, {}
        sampling_chunks = [chunk for chunk in output.chunks if chunk.will_sample]
        for row, chunk in zip(logits, sampling_chunks):
            request = requests[chunk.request_id]
            samples[chunk.request_id] = sample(row, request.sampling_params, request.generator)
            if not request.output_token_ids:
                first_token_logits[chunk.request_id] = row
        return RunnerOutput(samples=samples, first_token_logits=first_token_logits)
