"""The paged KV cache as one inspection run used it: the blocks the request held, how its
KV memory grew step by step, and the formula's report filled in with the run's cache.

Read from the trace alone (no model): each step's ``blocks_hit`` / ``blocks_allocated`` and
its KV write log (``inspect_run``), block size 16, N = 20, chunk size 7:

    step:       0                 1                 2
    blocks:     allocate [b0]     (b0 has room)     allocate [b1]   -> b0 full, b1 4/16
    written:    7 tokens x L      14 x L            20 x L          (the write log, cumulated)
    reserved:   1 block           1 block           2 blocks        (whole blocks held)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from prefillviz.analysis.memory import KVMemoryReport, kv_memory_report
from prefillviz.analysis.model_shape import ModelShape
from prefillviz.engine.errors import RequestError
from prefillviz.engine.trace import Trace
from prefillviz.experiments.inspect_run import InspectionRun, request_token_indices


@dataclass
class BlockUsage:
    """The paged cache as the request left it at the end of its prefill.

    Attributes:
        num_blocks: physical blocks in the engine's cache.
        block_size: token slots per block.
        block_ids: the request's blocks in block-table order (logical block 0 first).
        tokens_in_block: tokens held by each of them (``block_size`` except maybe the last).
        num_free_after_run: the engine's free blocks after the last step (a finished request's
            blocks go back to the free queue; full ones keep their hash for prefix caching).
    """

    num_blocks: int
    block_size: int
    block_ids: list[int]
    tokens_in_block: list[int]
    num_free_after_run: int

    @property
    def num_filled(self) -> int:
        return sum(t == self.block_size for t in self.tokens_in_block)

    @property
    def num_partial(self) -> int:
        return sum(0 < t < self.block_size for t in self.tokens_in_block)

    @property
    def num_free(self) -> int:
        return self.num_blocks - len(self.block_ids)


def block_usage(trace: Trace, request_id: str, num_tokens: int) -> BlockUsage:
    """Which physical blocks the request held for its ``num_tokens`` positions (from each step's
    ``blocks_hit`` / ``blocks_allocated``), and how full each one is."""
    block_size = int(trace.engine_config["block_size"])
    block_ids: list[int] = []
    for step in trace.steps:
        block_ids += step.blocks_hit.get(request_id, []) + step.blocks_allocated.get(request_id, [])
    tokens = [min(block_size, num_tokens - i * block_size) for i in range(len(block_ids))]
    return BlockUsage(
        num_blocks=trace.num_blocks,
        block_size=block_size,
        block_ids=block_ids,
        tokens_in_block=tokens,
        num_free_after_run=trace.steps[-1].num_free_blocks if trace.steps else trace.num_blocks,
    )


@dataclass
class MemoryGrowth:
    """The request's KV cache after each step, measured three ways.

    Attributes:
        tokens: (S + 1,) positions in the cache after each step (0 before the first).
        bytes_written: (S + 1,) K/V bytes the write log recorded, cumulated over steps.
        bytes_reserved: (S + 1,) bytes of the whole blocks the request held after each step.
        bytes_per_token: the formula's ``2 x layers x kv_heads x head_dim x dtype bytes``.
        block_size: tokens per block.
    """

    tokens: np.ndarray
    bytes_written: np.ndarray
    bytes_reserved: np.ndarray
    bytes_per_token: int
    block_size: int


def memory_growth(trace: Trace, request_id: str) -> MemoryGrowth:
    """Cumulated KV bytes from the write log, and whole-block reservations, step by step."""
    block_size = int(trace.engine_config["block_size"])
    tokens, written, reserved = [0], [0.0], [0]
    blocks_held = 0
    for step in trace.steps:
        indices = request_token_indices(step, request_id)
        blocks_held += len(step.blocks_hit.get(request_id, [])) + len(step.blocks_allocated.get(request_id, []))
        if len(indices) == 0 or step.kv_writes is None:
            continue
        writes = step.kv_writes
        per_token_all_layers = writes.bytes_per_layer * len(writes.layers_written) / len(writes.positions)
        tokens.append(tokens[-1] + len(indices))
        written.append(written[-1] + per_token_all_layers * len(indices))
        reserved.append(blocks_held * block_size * trace.kv_bytes_per_token)
    return MemoryGrowth(
        tokens=np.array(tokens),
        bytes_written=np.array(written),
        bytes_reserved=np.array(reserved),
        bytes_per_token=trace.kv_bytes_per_token,
        block_size=block_size,
    )


def shape_of_trace(trace: Trace, request_id: str) -> ModelShape:
    """The shape of the model that ran, read from the captured tensors of the trace itself
    (so it holds even when another model is loaded now)."""
    captured = trace.captured_qk.get(request_id)
    if captured is None or not captured.queries:
        raise RequestError("This run has no captured queries and keys: it was not run at capture level 'inspect'.")
    num_layers = len(captured.queries)
    num_heads, _, head_dim = captured.queries[0].shape
    num_kv_heads = captured.keys[0].shape[0]
    dtype_bytes = torch.empty((), dtype=getattr(torch, trace.dtype)).element_size()
    return ModelShape(
        architecture=trace.model_id,
        family="llama",
        num_layers=num_layers,
        num_heads=int(num_heads),
        num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim),
        hidden_size=int(num_heads * head_dim),
        intermediate_size=0,  # not in the trace; the KV report does not read it
        vocab_size=0,
        dtype_bytes=dtype_bytes,
    )


def memory_report(run: InspectionRun) -> KVMemoryReport:
    """``kv_memory_report`` for the model and dtype of this run, with the run's cache filled in."""
    trace = run.trace
    report = kv_memory_report(shape_of_trace(trace, run.request_id), dtype=trace.dtype, num_tokens=run.num_tokens)
    block_size = int(trace.engine_config["block_size"])
    report.block_size = block_size
    report.num_blocks = trace.num_blocks
    report.bytes_per_block = block_size * report.bytes_per_token
    report.bytes_per_block_per_layer = report.bytes_per_block // report.num_layers
    report.cache_num_bytes = trace.kv_cache_bytes
    report.capacity_tokens = trace.num_blocks * block_size
    return report
