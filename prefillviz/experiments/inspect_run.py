"""The inspection run behind the KV-cache and Attention views, and what its trace recorded.

One request, run on a fresh engine at capture level ``inspect``: in one step (parallel
prefill) or in chunks of ``chunk_size`` tokens (``EngineConfig(token_budget=chunk_size)``).
The Prefill page's result carries the same kind of inspection trace, so
``from_prefill_result`` turns it into the same ``InspectionRun`` and both views read either.

The helpers below only read the trace (no model, no Streamlit):

    step:       0                 1                 2          (chunk size 7, N = 20)
    packed:     [p0 .. p6]        [p7 .. p13]       [p14 .. p19]
    KV writes:  7 slots x L       7 slots x L       6 slots x L     -> (L, N) per position
    blocks:     allocate [b0]     (b0 has room)     allocate [b1]   -> b0 full, b1 4/16
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import torch

from prefillviz.analysis.attention_maps import all_head_summaries
from prefillviz.analysis.memory import KVMemoryReport, kv_memory_report
from prefillviz.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.errors import RequestError
from prefillviz.experiments.prefill import PrefillResult
from prefillviz.instrument.trace import StepRecord, Trace
from prefillviz.models import LoadedModel, ModelInfo
from prefillviz.progress import StepProgress

ONE_STEP_BUDGET = 1 << 20  # more tokens than any prompt: the whole prompt runs in one step
KV_QUANTITIES = {"key_norm": "key norm", "value_norm": "value norm", "bytes": "bytes written"}



@dataclass
class InspectionRun:
    """One prompt's inspection trace, wherever it came from.

    Attributes:
        model_id: the model that ran.
        prompt: the prompt text.
        token_ids: the prompt's token ids.
        token_texts: each token decoded on its own.
        request_id: the request inside ``trace``.
        trace: the run at capture level ``inspect`` (KV write log, captured q/k/v).
        chunk_size: tokens per step, or None for the whole prompt in one step.
        source: where it came from ("the Prefill page" or "this page").
    """

    model_id: str
    prompt: str
    token_ids: list[int]
    token_texts: list[str]
    request_id: str
    trace: Trace
    chunk_size: int | None
    source: str

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_steps(self) -> int:
        return self.trace.num_steps


def run_inspection(
    loaded: LoadedModel,
    prompt: str,
    chunk_size: int | None = None,
    make_progress: Callable[[int], StepProgress] | None = None,
    source: str = "this page",
) -> InspectionRun:
    """Prefill ``prompt`` on a fresh engine at capture level ``inspect``.

    Args:
        loaded: the model to run.
        prompt: the prompt text.
        chunk_size: tokens per step (the engine's ``token_budget``); None or 0 runs the whole
            prompt in one step.
        make_progress: called once with the number of steps the run will take; returns the
            engine's per-step progress callback (a progress bar).
        source: recorded in the result, for captions.

    Returns:
        The ``InspectionRun``.

    Raises:
        RequestError: empty prompt, too long for the model or the KV cache.
        ConfigError: a chunk size that is not a positive whole number.
    """
    chunk_size = chunk_size or None
    config = EngineConfig(token_budget=chunk_size or ONE_STEP_BUDGET)
    engine = LLMEngine(loaded.model, loaded.tokenizer, config, model_id=loaded.model_id)
    request = engine.add_request(prompt, SamplingParams(max_new_tokens=1))
    num_tokens = request.num_prompt_tokens
    progress = make_progress(math.ceil(num_tokens / config.token_budget)) if make_progress else None
    trace = engine.run(progress=progress, capture_level="inspect")
    token_ids = list(request.prompt_token_ids)
    return InspectionRun(
        model_id=loaded.model_id,
        prompt=prompt,
        token_ids=token_ids,
        token_texts=[loaded.tokenizer.decode([t]) for t in token_ids],
        request_id=request.request_id,
        trace=trace,
        chunk_size=chunk_size,
        source=source,
    )


def from_prefill_result(result: PrefillResult | None) -> InspectionRun | None:
    """The inspection pass of a ``PrefillResult`` (the Prefill page's run); None without one."""
    if result is None or result.inspection is None:
        return None
    return InspectionRun(
        model_id=result.model_id,
        prompt=result.prompt,
        token_ids=list(result.token_ids),
        token_texts=list(result.token_texts),
        request_id=result.request_id,
        trace=result.inspection,
        chunk_size=None,
        source="the Prefill page",
    )


# ---------------------------------------------------------------- reading the trace
def request_token_indices(step: StepRecord, request_id: str) -> np.ndarray:
    """Indices into the step's packed batch (and its KV write log) of one request's tokens."""
    offset = 0
    for chunk in step.chunks:
        if chunk.request_id == request_id:
            return np.arange(offset, offset + chunk.num_tokens)
        offset += chunk.num_tokens
    return np.arange(0)


def chunk_boundaries(trace: Trace, request_id: str) -> list[int]:
    """Start position of every prefill chunk the request ran, in step order ([0] for one step)."""
    return [
        chunk.start_position
        for step in trace.steps
        for chunk in step.chunks
        if chunk.request_id == request_id and chunk.is_prefill
    ]


def kv_write_matrix(trace: Trace, request_id: str, quantity: str = "key_norm") -> tuple[np.ndarray, np.ndarray]:
    """What each layer wrote for each position of one request, from the KV write log.

    Args:
        trace: an inspection trace.
        request_id: the request.
        quantity: ``"key_norm"`` / ``"value_norm"`` (L2 norm of the written vector, mean over
            KV heads) or ``"bytes"`` (K + V bytes written for that token in that layer).

    Returns:
        ``(positions, matrix)``: positions (N,) sorted, matrix (L, N) float64, row = layer.
    """
    if quantity not in KV_QUANTITIES:
        raise ValueError(f"quantity must be one of {', '.join(KV_QUANTITIES)}, got {quantity!r}")
    positions, columns = [], []
    for step in trace.steps:
        writes = step.kv_writes
        if writes is None:
            continue
        tokens = request_token_indices(step, request_id)
        if len(tokens) == 0:
            continue
        order = np.argsort(writes.layers_written)  # rows of the norms are in the order layers wrote
        if quantity == "bytes":
            per_token = writes.bytes_per_layer / len(writes.positions)
            column = np.full((len(writes.layers_written), len(tokens)), per_token)
        else:
            norms = writes.key_norms if quantity == "key_norm" else writes.value_norms  # (L, T, KVH)
            column = norms[order][:, tokens].mean(axis=2)
        positions.append(writes.positions[tokens])
        columns.append(column)
    if not columns:
        raise RequestError("This run has no KV write log: it was not run at capture level 'inspect'.")
    positions_all = np.concatenate(positions)
    sort = np.argsort(positions_all, kind="stable")
    return positions_all[sort], np.concatenate(columns, axis=1)[:, sort].astype(np.float64)


def kv_write_table(trace: Trace, request_id: str, quantity: str = "key_norm") -> pd.DataFrame:
    """``kv_write_matrix`` as one row per (layer, position), for downloads."""
    positions, matrix = kv_write_matrix(trace, request_id, quantity)
    num_layers = matrix.shape[0]
    return pd.DataFrame(
        {"layer": np.repeat(np.arange(num_layers), len(positions)), "position": np.tile(positions, num_layers), quantity: matrix.ravel()}
    )


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


def model_shape(trace: Trace, request_id: str) -> ModelInfo:
    """The shape of the model that ran, read from the captured tensors of the trace itself
    (so it holds even when another model is loaded now)."""
    captured = trace.captured_qk.get(request_id)
    if captured is None or not captured.queries:
        raise RequestError("This run has no captured queries and keys: it was not run at capture level 'inspect'.")
    num_layers = len(captured.queries)
    num_heads, _, head_dim = captured.queries[0].shape
    num_kv_heads = captured.keys[0].shape[0]
    dtype_bytes = torch.empty((), dtype=getattr(torch, trace.dtype)).element_size()
    return ModelInfo(
        architecture=trace.model_id,
        num_parameters=0,
        num_layers=num_layers,
        num_heads=int(num_heads),
        num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim),
        hidden_size=int(num_heads * head_dim),
        intermediate_size=None,
        vocab_size=0,
        max_context=None,
        dtype_bytes=dtype_bytes,
        kv_bytes_per_token=trace.kv_bytes_per_token,
    )


def memory_report(run: InspectionRun) -> KVMemoryReport:
    """``kv_memory_report`` for the model and dtype of this run, with the run's cache filled in."""
    trace = run.trace
    report = kv_memory_report(model_shape(trace, run.request_id), dtype=trace.dtype, num_tokens=run.num_tokens)
    block_size = int(trace.engine_config["block_size"])
    report.block_size = block_size
    report.num_blocks = trace.num_blocks
    report.bytes_per_block = block_size * report.bytes_per_token
    report.bytes_per_block_per_layer = report.bytes_per_block // report.num_layers
    report.cache_num_bytes = trace.kv_cache_bytes
    report.capacity_tokens = trace.num_blocks * block_size
    return report


def attention_summaries(run: InspectionRun, progress: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray]:
    """Entropy, sink score and mean look-back of every head, rebuilt from the captured q/k.

    Args:
        run: an inspection run.
        progress: called with (layers done, layers) after each layer.

    Returns:
        ``all_head_summaries`` output: ``{"entropy", "sink", "mean_lookback"}`` -> (layers, heads).
    """
    captured = run.trace.captured_qk.get(run.request_id)
    if captured is None or not captured.queries:
        raise RequestError("This run has no captured queries and keys: it was not run at capture level 'inspect'.")
    layers = []
    for layer, (q, k, scaling) in enumerate(zip(captured.queries, captured.keys, captured.scaling)):
        layers.append(all_head_summaries([q], [k], [scaling]))
        if progress is not None:
            progress(layer + 1, len(captured.queries))
    return {name: np.concatenate([summary[name] for summary in layers]) for name in layers[0]}
